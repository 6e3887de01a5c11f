import cProfile, pstats, sys, time, torch, statistics as st
from benchmarks.decode_peers import greedy_demo
torch.set_num_threads(1)
demo, _ = greedy_demo(128, 256, 50, 40, 64)
model = demo.model
sources = [list(i.source_ids) for i in model.wl.load("test")[:64]]
limits = [min(40, 2 * len(s)) for s in sources]
def run():
    return model.batch.run_programs([model.program(s, n) for s, n in zip(sources, limits)], "typewise_greedy", grad=False)
with torch.no_grad():
    for _ in range(3): run()
    secs = []
    for _ in range(7):
        t0 = time.process_time(); out = run(); secs.append((time.process_time()-t0, dict(out.seconds), [s.run.seconds for s in out.segments]))
    secs.sort(key=lambda x: x[0]); tot, sec, segs = secs[3]
    print("cpu ms", tot*1e3, {k: round(v*1e3,1) for k,v in sec.items()}, "first seg exec", round(segs[0]*1e3,1), "rest exec", round(sum(segs[1:])*1e3,1), len(segs))
    if "--prof" in sys.argv:
        pr = cProfile.Profile(); pr.enable()
        for _ in range(5): run()
        pr.disable()
        p = pstats.Stats(pr); p.sort_stats(sys.argv[-1] if sys.argv[-1] != "--prof" else "tottime").print_stats(50)
