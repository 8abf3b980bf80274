"""Toy stand-in for inference/engram.py (unused by the toy model)."""
