"""Hardware profiles: what a GPU node can do, each number with its source."""

from memo_sim.profile.schema import Curve, HardwareProfile, Quantity
from memo_sim.profile.loader import list_profiles, load_profile, profile_dirs

__all__ = ["Curve", "HardwareProfile", "Quantity", "list_profiles", "load_profile", "profile_dirs"]
