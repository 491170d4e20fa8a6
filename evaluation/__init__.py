"""Benchmarks, quality evaluation and cross-backend parity (the logic behind `specfill bench`,
`specfill eval` and `specfill parity`), with the fixed evaluation text in data/."""
