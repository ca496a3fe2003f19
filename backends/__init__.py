"""Model runners behind one contract (`base.py`). Each backend package declares what it can do in the registry
(`registry.py`) when imported here; none imports torch, mlx or llama_cpp until a model loads with it."""
from . import llamacpp, mlx, torch  # noqa: F401 - each registers itself
