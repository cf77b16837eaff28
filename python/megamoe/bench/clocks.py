"""What the board runs at, for `layer --clocks`: the nvidia-smi fields sampled (SM clock, power, cap, temperature,
clock event reasons), the summary of a phase's samples, and this process's GPU as nvidia-smi names it."""
import collections
import shutil
import statistics
import subprocess

import torch


CLOCK_FIELDS = ("clocks.sm", "power.draw", "enforced.power.limit", "temperature.gpu")
CLOCK_REASONS = ("sw_power_cap", "hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown",
                 "sw_thermal_slowdown", "sync_boost")


def clock_query():
    """nvidia-smi --query-gpu fields for --clocks: CLOCK_FIELDS, then each clock event reason under the name this
    driver knows (clocks_event_reasons, earlier clocks_throttle_reasons); None without nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return None
    for name in ("clocks_event_reasons", "clocks_throttle_reasons"):
        probe = subprocess.run(["nvidia-smi", "--query-gpu=%s.sw_power_cap" % name, "--format=csv,noheader"],
                               capture_output=True, text=True)
        if probe.returncode == 0:
            return list(CLOCK_FIELDS) + ["%s.%s" % (name, k) for k in CLOCK_REASONS]
    return list(CLOCK_FIELDS)


def clock_summary(query, lines, skip=4):
    """nvidia-smi's `csv,noheader,nounits` samples of `query` (one line each; the first `skip`, taken before the
    phase reached its steady state, dropped): medians of the clock, power, cap and temperature, the clock's range,
    and how many samples had each combination of active reasons ("none": none active). None without samples."""
    rows = [[c.strip() for c in line.split(",")] for line in lines]
    rows = [r for r in rows if len(r) == len(query)][skip:]
    if not rows:
        return None

    def values(field):
        out = []
        for r in rows:
            try:
                out.append(float(r[query.index(field)]))
            except ValueError:  # [N/A]
                pass
        return out or [float("nan")]

    reasons = collections.Counter()
    for r in rows:
        active = [f.split(".", 1)[1] for f in query[len(CLOCK_FIELDS):] if r[query.index(f)].lower() == "active"]
        reasons["+".join(active) or "none"] += 1
    return {"samples": len(rows), "sm_mhz": statistics.median(values("clocks.sm")),
            "sm_mhz_min": min(values("clocks.sm")), "sm_mhz_max": max(values("clocks.sm")),
            "power_w": statistics.median(values("power.draw")),
            "power_cap_w": statistics.median(values("enforced.power.limit")),
            "temperature_c": statistics.median(values("temperature.gpu")), "reasons": dict(reasons.most_common())}


def gpu_id():
    """This process's GPU as nvidia-smi -i names it: its UUID (CUDA's device order need not be nvidia-smi's)."""
    uuid = str(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", "") or "")
    if not uuid:
        return str(torch.cuda.current_device())
    return uuid if uuid.startswith("GPU-") else "GPU-" + uuid
