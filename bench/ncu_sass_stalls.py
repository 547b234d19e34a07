# Nsight Compute's SASS page (`ncu -i R --page source --print-source sass --csv > F`) as stall tables:
# usage: ncu_sass_stalls.py F [N] -> for each kernel of the report (each starts a "Kernel Name" line), the total
# warp-stall samples, the ten largest stall reasons, and the N (30) SASS lines with the most samples, in address
# order, each with its three largest reasons. (Nsight writes a kernel's page twice: a repeat is skipped.)
import csv,sys

def table(name,rows,n):
    h=rows[0]; data=[r for r in rows[1:] if len(r)==len(h)]
    ia=h.index('Source'); isamp=h.index('Warp Stall Sampling (All Samples)')
    stall_cols=[i for i,c in enumerate(h) if c.startswith('stall_') and '(Not Issued)' not in c]
    tot=sum(int(r[isamp] or 0) for r in data)
    print('==',name)
    print('total samples',tot)
    agg={h[i]:sum(int(r[i] or 0) for r in data) for i in stall_cols}
    for k,v in sorted(agg.items(),key=lambda x:-x[1])[:10]: print('  %-25s %6d %.1f%%'%(k,v,100*v/max(tot,1)))
    top=sorted(range(len(data)),key=lambda i:-int(data[i][isamp] or 0))[:n]
    for i in sorted(top):
        r=data[i]
        reasons=sorted(((int(r[c] or 0),h[c]) for c in stall_cols),reverse=True)[:3]
        print('%5d %6s %-60s %s'%(i,r[isamp],r[ia].strip()[:60],' '.join('%s=%d'%(c[6:],v) for v,c in reasons if v)))

n=int(sys.argv[2]) if len(sys.argv)>2 else 30
kernels=[]
for r in csv.reader(open(sys.argv[1])):
    if r and r[0]=='Kernel Name': kernels.append((r[1] if len(r)>1 else '?',[]))
    elif kernels: kernels[-1][1].append(r)
seen=[]
for k in kernels:
    if k in seen: continue
    seen.append(k)
    table(k[0],k[1],n)
