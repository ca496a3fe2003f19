"""The MLX backend: Metal on Apple Silicon, MLX's CPU build elsewhere; registered as "mlx" in backends/__init__."""
