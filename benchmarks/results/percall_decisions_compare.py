import json
A={(r['pattern'],r['mode']):r for r in map(json.loads,open('/tmp/sweep_a.jsonl'))}
B=[json.loads(l) for l in open('/tmp/sweep_b.jsonl')]
same=diff=0
for r in B:
    a=A[(r['pattern'],r['mode'])]
    da,db=a['speed'][-1],r['speed'][-1]
    flag = "FLIP" if da['choice']!=db['choice'] else ""
    if flag: diff+=1
    else: same+=1
    ga,gb=da['graph'][:8],db['graph'][:8]
    print(f"{r['pattern']:26s} {r['mode']:5s} A {da['choice'][0]} k/e {da['kernels_ms']/da['eager_ms']:.3f} ({len(a['speed'])}) | B {db['choice'][0]} k/e {db['kernels_ms']/db['eager_ms']:.3f} ({len(r['speed'])}) {'same name' if ga==gb else 'NAME DIFFERS'} {flag}")
print("same",same,"flipped",diff)
