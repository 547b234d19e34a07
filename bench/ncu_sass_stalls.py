# Nsight Compute's SASS page (`ncu -i R --page source --print-source sass --csv > F`) as a stall table:
# usage: ncu_sass_stalls.py F [N] -> total warp-stall samples, the ten largest stall reasons, and the N
# (30) SASS lines with the most samples, in address order, each with its three largest reasons.
import csv,sys
f=sys.argv[1]
rows=list(csv.reader(open(f)))
h=rows[1]; data=rows[2:]
ia=h.index('Source'); isamp=h.index('Warp Stall Sampling (All Samples)'); iex=h.index('Instructions Executed')
stall_cols=[i for i,n in enumerate(h) if n.startswith('stall_') and '(Not Issued)' not in n]
tot=sum(int(r[isamp] or 0) for r in data)
print('total samples',tot)
# by stall reason
agg={h[i]:sum(int(r[i] or 0) for r in data) for i in stall_cols}
for k,v in sorted(agg.items(),key=lambda x:-x[1])[:10]: print('  %-25s %6d %.1f%%'%(k,v,100*v/tot))
# top instructions
top=sorted(range(len(data)),key=lambda i:-int(data[i][isamp] or 0))[:int(sys.argv[2]) if len(sys.argv)>2 else 30]
for i in sorted(top):
    r=data[i]
    reasons=sorted(((int(r[c] or 0),h[c]) for c in stall_cols),reverse=True)[:3]
    print('%5d %6s %-60s %s'%(i,r[isamp],r[ia].strip()[:60],' '.join('%s=%d'%(n[6:],v) for v,n in reasons if v)))
