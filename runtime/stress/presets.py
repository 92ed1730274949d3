"""Named stress profiles (``vnpu stress-test --profile black_friday_2024``): the presets shipped in
``runtime/stress/profiles.yaml`` -- each a rate shape (points at a share of the duration, rates as a share of
the peak), a peak rate, a duration and a fault plan (kinds and one every ...).  ``--rate``, ``--duration``
and ``--faults`` override a preset's own.  Pure: reads the file, builds a :class:`Preset`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .profiles import Profile, ProfileError, from_doc

FILE = Path(__file__).with_name("profiles.yaml")


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    rate: float                      #: peak requests/s
    duration_s: float
    points: tuple                    #: ({at: "N%", rate: "N%"}, ...) as in the file
    step: bool
    faults: tuple[str, ...]
    every_s: float

    def profile(self, rate: float | None = None, duration_s: float | None = None) -> Profile:
        """The rate profile, the preset's peak and duration unless overridden; points at ``N%`` of the
        duration scale with it."""
        d = duration_s or self.duration_s
        pts = [{"at": _at(p["at"], d), "rate": p["rate"]} for p in self.points]
        return from_doc({"points": pts, "step": self.step}, rate or self.rate, d, self.name)


def _at(v, d: float):
    if isinstance(v, str) and v.strip().endswith("%"):
        return float(v.strip()[:-1]) / 100.0 * d
    return v


def load(path: Path = FILE) -> dict[str, Preset]:
    """Every preset of the profiles file; :class:`ProfileError` (one line) when it is malformed."""
    import yaml

    from runtime.cliargs import parse_duration
    from runtime.stress.faults import STRESS_FAULTS
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict) or doc.get("version") != 1 or not isinstance(doc.get("profiles"), dict):
        raise ProfileError(f"{path}: needs version: 1 and profiles: {{NAME: ...}}")
    out = {}
    for name, p in doc["profiles"].items():
        try:
            faults = tuple(p.get("faults") or ())
            bad = [f for f in faults if f not in STRESS_FAULTS]
            if bad:
                raise ProfileError(f"unknown fault {bad[0]!r} (known: {', '.join(STRESS_FAULTS)})")
            out[name] = Preset(name, str(p.get("description", "")), float(p["rate"]),
                               parse_duration(str(p["duration"])), tuple(p["points"]), bool(p.get("step", False)),
                               faults, parse_duration(str(p.get("every", "30s"))))
            out[name].profile()                          # the shape is checked now, not at the run
        except (KeyError, TypeError, ValueError) as e:
            raise ProfileError(f"{path}: profile {name}: {e}") from None
    return out
