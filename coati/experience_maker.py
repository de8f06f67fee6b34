"""ColossalChat's import path for experience: `from coati.experience_maker import Experience` (the callback
documentation's example) finds coati's `Experience` and experience makers, which live in `coati.experience`."""
from coati.experience.experience import Experience, ExperienceMaker, GRPOExperienceMaker, PPOExperienceMaker

__all__ = ["Experience", "ExperienceMaker", "GRPOExperienceMaker", "PPOExperienceMaker"]
