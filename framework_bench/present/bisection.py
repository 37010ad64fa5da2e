"""`fbench bisect` in words: each probe as it ends, then the release it found."""

from __future__ import annotations

from framework_bench.run.bisect import Bisection, Probe


def probe_line(p: Probe) -> str:
    if p.ratio is None:
        return f"{p.version}: {p.why}"
    interval = f" (95% interval {p.low:.3f}-{p.high:.3f})" if p.low is not None else " (no interval)"
    return f"{p.version}: {p.ratio:.3f}x the good release's TGS{interval}: {'slower' if p.bad else 'good'}"


def lines(b: Bisection, threshold: float) -> list[str]:
    source = (f"{len(b.releases)} releases from the index" if b.listed
              else "the release list could not be had (offline?): only the two given")
    out = [f"{b.package} {b.good} -> {b.bad}: {source}, {len(b.probes)} probed"]
    if b.interrupted:
        out.append("interrupted: no release named")
    elif b.first_bad is not None:
        before = b.releases[b.releases.index(b.first_bad) - 1]
        out.append(f"first release slower than {b.good} by more than {threshold:g}%: {b.package} {b.first_bad} "
                   f"(the one before, {before}, was not)")
    else:
        out.append(f"{b.bad} is not slower than {b.good} by more than {threshold:g}% here: nothing to bisect")
    return out
