import asyncio, time, sys, cProfile, pstats, os
sys.path.insert(0, "/work/main")
from fsm_engine import Engine
from fsm_engine.llm import Scripted
files = sorted(p for p in (os.path.join("/usr/share/common-licenses", f) for f in os.listdir("/usr/share/common-licenses")) if os.path.isfile(p))
V={"text": '{"decision": "approve", "categories": [], "summary": "fine"}', "prompt_tokens": 50, "completion_tokens": 20, "delay_s": 0.01}
eng = Engine("fsm.db", llm=Scripted.from_replies([V]), concurrency=int(sys.argv[1]))
t=time.perf_counter()
ids=[eng.start("/work/main/machines/moderation.py", {"path": files[i%len(files)]}) for i in range(200)]
print("start", time.perf_counter()-t)
t=time.perf_counter()
pr=cProfile.Profile(); pr.enable()
asyncio.run(eng.resume())
pr.disable()
print("run", time.perf_counter()-t, eng.committer.batches, eng.committer.steps)
pstats.Stats(pr).sort_stats("cumulative").print_stats(25)
