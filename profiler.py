"""Where a training step's time goes: train.py --profile-steps N runs N full optimizer steps under
torch.profiler (StepProfiler) and writes a summary per rank, kernel time per step by category, the
device's idle time and the top kernels (on CPU: the ops' self time); bench.py --profile summarises its
generation profiles the same way (profile_summary).
"""
import collections
import math
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist


def print0(*args):
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(*args, flush=True)


PROFILE_RULES = [   # (category, substrings of the lower-cased kernel or CPU op name): the first match wins
    ("communication", ("nccl", "gloo", "c10d::", "record_param_comms")),
    ("optimizer, foreach (Adam, clipping, grad sums, master copies)", ("adam", "foreach", "multi_tensor")),
    ("attention", ("flash", "fmha", "sdpa", "attention", "_decode_kernel")),    # the last: model.decode_attention
    ("GEMM", ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas", "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")),
    ("triton fused kernels (inductor)", ("triton_",)),
    ("copies, memset", ("memcpy", "memset", "copy_")),
]
COMMUNICATION = [("all-gather", ("allgather", "all_gather")), ("reduce-scatter", ("reducescatter", "reduce_scatter")),
                 ("all-reduce", ("allreduce", "all_reduce"))]


def profile_category(name):
    """PROFILE_RULES' category of a kernel or op name; communication split by collective where the name says."""
    low = name.lower()
    for category, keys in PROFILE_RULES:
        if any(k in low for k in keys):
            if category == "communication":
                return "communication: " + next((c for c, ks in COMMUNICATION if any(k in low for k in ks)), "other")
            return category
    return "other (elementwise, reductions, ...)"


def busy_time(intervals):
    """Length of the union of (start, end) intervals: time when at least one of them runs."""
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def profile_summary(events, wall_s, steps, cuda, title, note="(train.py runs eager attention: its matmuls count as GEMM, its softmax as other)"):
    """The text of a profile file from torch.profiler's events: wall time, time per step by category and
    the time no kernel ran (with CUDA: device kernels, memcpy and memset; without: the CPU ops' self time
    and the time outside any op), the top 25 kernels or ops."""
    from torch.autograd import DeviceType
    if cuda:
        evs = [e for e in events if e.device_type == DeviceType.CUDA and not e.is_user_annotation    # kernels,
               and getattr(e, "activity_type", None) != "gpu_user_annotation"]                     # memcpy, memset
        dur = {id(e): e.time_range.end - e.time_range.start for e in evs}          # us
        what, idle_label = "device (CUDA) kernel time", "GPU idle (no kernel running: wall - union of kernel intervals)"
    else:
        evs = [e for e in events if e.device_type == DeviceType.CPU and not e.is_user_annotation and not e.is_async]
        dur = {id(e): e.self_cpu_time_total for e in evs}
        what, idle_label = "CPU time (no CUDA: ops' self time)", "outside any op (Python, hooks, data: wall - union of op intervals)"
    total = sum(dur.values()) or 1e-9
    by_cat, by_name = collections.Counter(), collections.defaultdict(lambda: [0, 0.0])
    for e in evs:
        by_cat[profile_category(e.name)] += dur[id(e)]
        by_name[e.name][0] += 1
        by_name[e.name][1] += dur[id(e)]
    per_step = lambda us: us / 1e3 / steps                                         # us summed -> ms per step
    lines = [title, f"wall time: {wall_s:.4f} s for {steps} steps = {1e3 * wall_s / steps:.2f} ms/step "
             "(synchronized at start and end, under the profiler)", "",
             f"{what} per step, by category (substrings of the names: bench.PROFILE_RULES):",
             f"{'category':<66} {'ms/step':>10} {'%':>6}"]
    lines += [f"{c:<66} {per_step(t):>10.3f} {100 * t / total:>6.1f}" for c, t in by_cat.most_common()]
    busy = busy_time([(e.time_range.start, e.time_range.end) for e in evs])
    lines += [f"{'sum of categories':<66} {per_step(total):>10.3f} {100.0:>6.1f}",
              f"{idle_label:<66} {max(1e3 * wall_s / steps - per_step(busy), 0):>10.3f}"]
    if cuda:
        lines.append("(kernels on different streams overlap, e.g. NCCL beside compute: the sum can exceed the busy time)")
    lines.append(note)
    if cuda:
        lines += host_ranges(events, steps)
    lines += ["", f"top 25 by total time ({'kernels' if cuda else 'CPU ops, self time'}):",
              f"{'total ms':>10} {'calls':>7} {'%':>6}  name"]
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:25]
    lines += [f"{t / 1e3:>10.3f} {n:>7} {100 * t / total:>6.1f}  {name.removeprefix('void ')[:90]}" for name, (n, t) in top]
    return "\n".join(lines) + "\n"


def host_ranges(events, steps):
    """Lines of the host's side of a CUDA profile: the named ranges (train.py's train::*, FSDP's FSDP::*,
    the optimizer's) by wall time per step, and kernel launches per step. A step whose host time exceeds
    its device time is bound by Python and launches, not by the GPU."""
    from torch.autograd import DeviceType
    spans = collections.defaultdict(lambda: [0, 0.0])
    launches = 0
    for e in events:
        if e.device_type != DeviceType.CPU:
            continue
        if e.is_user_annotation or e.name.startswith(("train::", "FSDP::", "Optimizer.")):
            spans[e.name][0] += 1
            spans[e.name][1] += e.time_range.end - e.time_range.start
        elif "LaunchKernel" in e.name:
            launches += 1
    lines = ["", f"host (CPU) time per step in named ranges (nested ranges overlap); {launches / steps:.0f} kernel launches per step:",
             f"{'range':<66} {'ms/step':>10} {'calls/step':>10}"]
    top = sorted(spans.items(), key=lambda kv: -kv[1][1])[:14]
    return lines + [f"{name[:66]:<66} {t / 1e3 / steps:>10.3f} {n / steps:>10g}" for name, (n, t) in top]


def profile_window(after, n, steps_per_epoch, short_last, start, total):
    """The first n consecutive optimizer steps (0-based) from `after` on that are full ones: not step 0
    (it compiles), not an epoch's short last step (`short_last`: the epoch ends in one), none done before
    `start` (a resumed run). An empty range when they do not fit before `total`."""
    s = max(after, start, 1)
    while s + n <= total:
        short = [i for i in range(s, s + n) if short_last and i % steps_per_epoch == steps_per_epoch - 1]
        if not short:
            return range(s, s + n)
        s = short[-1] + 1
    return range(0)


class StepProfiler:
    """train.py --profile-steps N: torch.profiler (CPU, and CUDA if there is one) around N full optimizer
    steps after --profile-after, synchronized at both ends; the summary goes to RUN/profile_rank{r}.txt
    (profile_<stage>_rank{r}.txt for the stages of a sequential run). No trace is exported."""

    def __init__(self, trainer, start):
        t, args = trainer, trainer.args
        self.window = profile_window(args.profile_after, args.profile_steps, t.steps_per_epoch,
                                     len(t.trainset) % args.global_batch != 0, start, t.total)
        name = "profile" + ("" if t.stage_name == "final" else f"_{t.stage_name}") + f"_rank{t.rank}.txt"
        self.path, self.device, self.prof = Path(args.out) / name, t.device, None
        cuda = t.device.type == "cuda"
        self.title = (f"profile of optimizer steps {self.window.start + 1}-{self.window.stop} (log.jsonl's numbering), "
                      f"stage {t.stage_name}, rank {t.rank} of {t.world}, "
                      f"{torch.cuda.get_device_name(t.device) if cuda else 'CPU'}, torch {torch.__version__}")
        if not self.window:
            print0(f"[{t.stage_name}] --profile-steps {args.profile_steps}: that many full steps after step "
                         f"{args.profile_after} do not fit in {t.total}; not profiled")

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def begin(self, step):
        """Before optimizer step `step` (0-based)."""
        if self.window and step == self.window.start:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.sync()
            self.prof = torch.profiler.profile(activities=activities)
            self.prof.start()
            self.t0 = time.perf_counter()

    def end(self, step):
        """After optimizer step `step` (0-based) and its log line: the file, after the window's last step.
        Returns the seconds this took (the profiler's post-processing: seconds to minutes), 0 otherwise."""
        if not (self.window and step == self.window[-1]):
            return 0.0
        self.sync()
        t1 = time.perf_counter()
        self.prof.stop()
        try:
            text = profile_summary(self.prof.events(), t1 - self.t0, len(self.window), self.device.type == "cuda", self.title)
        except Exception:                                # a profile never stops the training it measures
            text = f"{self.title}\nthe summary failed:\n{traceback.format_exc()}"
        self.path.write_text(text)
        print0(f"profile of steps {self.window.start + 1}-{self.window.stop}: {self.path}")
        self.prof = None
        return time.perf_counter() - t1
