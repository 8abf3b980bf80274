"""Toy stand-in for inference/convert.py: copies model.safetensors to model0-mp1.safetensors."""
import argparse
import shutil
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("--hf-ckpt-path", required=True)
ap.add_argument("--save-path", required=True)
ap.add_argument("--n-experts", type=int, required=True)
ap.add_argument("--model-parallel", type=int, default=1)
ap.add_argument("--expert-dtype", default="fp4")
a = ap.parse_args()
Path(a.save_path).mkdir(parents=True, exist_ok=True)
shutil.copy(Path(a.hf_ckpt_path) / "model.safetensors", Path(a.save_path) / "model0-mp1.safetensors")
