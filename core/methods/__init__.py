"""Each prefill method written once over the ops protocol (core/ops.py)."""
