"""The one request pipeline every local generation and embedding goes through: plan (no model) -> acquire ->
prepare (render, tokenize, fit, sample params; in the worker pool) -> engine stream -> a dialect's reply. Imports no
dialect."""
