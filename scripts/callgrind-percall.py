#!/usr/bin/env python3
# usage: callgrind-percall.py CALLGRIND_OUT PATTERN... (issue 18, session 17): for each function whose
# name contains PATTERN (tagged with the binary), its inclusive cost, the calls its callers made
# (the "(Nx)" counts of the caller tree summed) and the cost per call.
import sys,re,subprocess
f=sys.argv[1]; pats=sys.argv[2:]
txt=subprocess.run(['callgrind_annotate','--inclusive=yes','--tree=caller','--threshold=100',f],capture_output=True,text=True).stdout
blocks=txt.split('\n\n')
for pat in pats:
    best=None
    for b in blocks:
        lines=b.strip('\n').split('\n')
        star=[l for l in lines if re.match(r'^\s*[\d,]+ \(\s*[\d.]+%\)  \*  ',l)]
        if not star: continue
        s=star[0]
        if pat not in s or '[' not in s: continue
        cost=int(s.split()[0].replace(',',''))
        calls=sum(int(m.replace(',','')) for l in lines if '  < ' in l for m in re.findall(r'\(([\d,]+)x\)',l)[-1:])
        if best is None or cost>best[0]: best=(cost,calls,s.split('*  ')[1][-90:])
    if best: print(f"{best[0]:>12,} {best[1]:>9,} {best[0]/max(best[1],1):>9.0f}  {best[2]}")
    else: print("not found", pat)
