"""AdamGnT's ``1 − β2^t`` over CBP's flat parameters (49-200x4-10, 64-byte aligned views): ``pow`` per view, as
the package computes it, against a table lookup; and where ``torch.pow``'s vectorised loop and its scalar path
differ. ``OMP_NUM_THREADS=1 python docs/results/pmnist_task_cost/pow_lookup.py``."""

import itertools
import time

import torch

torch.set_num_threads(1)
beta = torch.tensor(0.999)
k = torch.arange(98_304, dtype=torch.float32)  # a multiple of 32: every element in the vectorised loop
strided = torch.zeros(98_304, 2)
strided[:, 0] = k  # a strided view: every element in the scalar loop
vec, scalar = torch.pow(beta, k), torch.pow(beta, strided[:, 0])
print("integer t where the vectorised and the scalar pow differ:", int((vec != scalar).sum()), "of", vec.numel())

shapes = [(200, 49), (200,), (200, 200), (200,), (200, 200), (200,), (200, 200), (200,), (10, 200), (10,)]
numels = [int(torch.tensor(s).prod()) for s in shapes]
offsets = [0, *itertools.accumulate(-(-n // 16) * 16 for n in numels)]
t, power, out, out2 = (torch.zeros(offsets[-1]) for _ in range(4))
views = [(t[o : o + n], power[o : o + n]) for o, n in zip(offsets[:-1], numels, strict=True)]
gen = torch.Generator().manual_seed(0)
for counts, _ in views:  # step 3,000, 5 % of the counts reset at some earlier step
    reset = torch.rand(counts.shape, generator=gen) < 0.05
    counts.copy_(3000 - torch.randint(0, 3000, counts.shape, generator=gen) * reset)


def per_view() -> torch.Tensor:
    for counts, pw in views:
        torch.pow(beta, counts, out=pw)
    return torch.sub(1, power, out=out)


table = 1 - torch.cat([torch.pow(beta, k[i : i + 32_768]) for i in range(0, 98_304, 32_768)])
index, clamped = torch.empty(offsets[-1], dtype=torch.int32), torch.zeros(offsets[-1])


def lookup() -> torch.Tensor:  # every element as the vectorised loop computes it: not so in each view's tail
    torch.clamp(t, max=98_303, out=clamped)
    index.copy_(clamped)
    return torch.index_select(table, 0, index, out=out2)


print("elements where the lookup differs from pow per view:", int((lookup() != per_view()).sum()))
times: dict[str, list[float]] = {"pow per view": [], "lookup": []}
for _ in range(6):  # interleaved; the first round warms up and is dropped
    for name, fn in (("pow per view", per_view), ("lookup", lookup)):
        start = time.process_time()
        for _ in range(300):
            fn()
        times[name].append((time.process_time() - start) / 300 * 1e3)
print({name: (round(min(v[1:]), 3), round(max(v[1:]), 3)) for name, v in times.items()}, "ms a step")
