"""Model configurations and the op graph of one transformer layer."""

from memo_sim.model.config import PRESETS, ModelConfig, get_model, model_from_file

__all__ = ["PRESETS", "ModelConfig", "get_model", "model_from_file"]
