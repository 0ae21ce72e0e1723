"""Build the vllm 0.26.0 bundle that is carried to the lent H100 in <= 60 MiB pieces.

Why this shape:
- The device image already has torch 2.11.0+cu130 / torchvision 0.26.0 / torchaudio 2.11.0 /
  transformers 5.17 / triton 3.6, which is exactly what vllm 0.26.0 pins; vllm's CUDA
  extensions link libcudart.so.13, matching that torch. So only vllm and the packages the
  image lacks travel, installed with --no-deps so torch is never touched.
- The full set (vllm wheel 289 MiB + 110 missing deps 584 MiB = ~873 MiB, ~15 calls of
  60 MiB) cannot be carried within the device time one helper has. The bundle leaves out
  what a colocated bf16 dense-model engine on Hopper never imports (checked in the vllm
  sources: each is imported lazily or behind a capability/feature check), see EXCLUDED.
- The tree is installed here with the same Python minor as the device (3.12) and packed as
  one tar.xz: xz shrinks the FA3 kernel library 3.5x against the wheel's deflate.

Usage (here, repo root):  python3 scripts/device/vllm_bundle.py [--python PY312]
Device side: scripts/device/vllm_join.sh (joins, unpacks to /tmp/vsite, import check).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ROOT / ".vllm-whl"  # download cache (ignored via .git/info/exclude)
BUILD = ROOT / ".vllm-build"  # install tree + archive (ignored)
PIECES = ROOT / ".vllm-pieces"  # one sub-folder per device call (ignored)
PIECE_BYTES = 58 * 2**20  # leaves room for the repo itself inside the 64 MiB per call

VLLM = "vllm==0.26.0"

# Resolved with `pip install --dry-run --report` for cp312 manylinux x86_64, minus the
# packages KINDS.md lists for the device image.
CARRIED = """
annotated-types==0.8.0 anthropic==2.12.0 astor==0.8.1 blake3==1.0.11 cachetools==8.0.1
cbor2==6.3.0 cffi==2.1.1 compressed-tensors==0.17.0 cryptography==50.0.2 depyf==0.20.0
dill==0.4.1 dnspython==2.9.2 docstring-parser==0.18.0 email-validator==2.4.0
fastapi==0.136.3 googleapis-common-protos==1.76.0 httpcore2==2.16.2 httptools==0.9.0
httpx2==2.16.2 ijson==3.6.0 interegular==0.3.3 jiter==0.19.0 jmespath==1.1.0
jsonschema==4.26.0 jsonschema-specifications==2025.9.1 lark==1.2.2 llguidance==1.7.6
lm-format-enforcer==0.11.3 loguru==0.7.3 mcp==2.3.0 mcp-types==2.3.0 mistral-common==1.13.1
model-hosting-container-standards==0.1.16 msgspec==0.22.0 nvtx==0.2.15 openai==3.54.0
openai-harmony==0.0.8 opentelemetry-api==1.45.2 opentelemetry-exporter-otlp==1.45.2
opentelemetry-exporter-otlp-proto-common==1.45.2 opentelemetry-exporter-otlp-proto-grpc==1.45.2
opentelemetry-exporter-otlp-proto-http==1.45.2 opentelemetry-exporter-otlp-common==0.66b2
opentelemetry-exporter-http-transport==0.66b2 opentelemetry-proto==1.45.2
opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions==0.66b2
opentelemetry-semantic-conventions-ai==0.5.1 outlines-core==0.2.14
partial-json-parser==0.2.1.1.post7 prometheus-fastapi-instrumentator==8.1.0 pybase64==1.5.1
pycparser==3.12 pycountry==26.2.16 pydantic==2.14.3 pydantic-core==2.50.4 pydantic-extra-types==2.11.1
pydantic-settings==2.16.3 pyjwt==2.15.1 python-dotenv==1.2.4 python-json-logger==4.2.0
python-multipart==0.0.34 pyzmq==27.3.0 referencing==0.37.0 rpds-py==2026.9.1
setproctitle==1.3.8 sniffio==1.3.1 sse-starlette==3.7.0 starlette==1.10.0
typing-inspection==0.4.5 uvicorn==0.54.0 watchfiles==1.3.0 websockets==17.4 xgrammar==0.2.7
apache-tvm-ffi==0.1.10 torch-c-dlpack-ext==0.1.5
""".split()
# The last line and pycountry were carried as extra wheels beside the first archive, after the
# device showed they are imported at engine start: transformers' MistralCommonBackend (from
# vllm's guidance backend) -> mistral_common -> pydantic_extra_types.language_code ->
# pycountry; vllm's xgrammar backend -> xgrammar -> tvm_ffi.

# name -> why it stays behind (size in MiB as a wheel)
EXCLUDED = {
    "tokenspeed-triton": "91; only for tokenspeed-mla (MLA models)",
    "tokenspeed-mla": "MLA attention (DeepSeek-style), not Qwen2",
    "nvidia-cutlass-dsl": "CuTe DSL kernels: FA4 (Blackwell), mamba, MoE, DeepSeek ops",
    "nvidia-cutlass-dsl-libs-base": "85+84+3 with cu12/cu13 libs; same as above",
    "nvidia-cutlass-dsl-libs-cu12": "same as above",
    "nvidia-cutlass-dsl-libs-cu13": "same as above",
    "nvidia-cutlass-dsl-libs-core": "same as above",
    "quack-kernels": "CuTe DSL kernels (needs cutlass-dsl)",
    "humming-kernels": "quantized GEMM kernels",
    "tilelang": "44; JIT kernels for sparse/MLA paths, imported lazily",
    "z3-solver": "28; tilelang dependency",
    "nvidia-nvvm": "72; tilelang/cuda-tile JIT toolchain",
    "nvidia-cuda-nvcc": "45; same",
    "nvidia-cuda-crt": "same",
    "nvidia-cuda-nvdisasm": "same",
    "nvidia-cuda-cccl": "same",
    "cuda-tile": "same",
    "cuda-python": "metapackage; the image has cuda-bindings",
    "pynvvideocodec": "42; video decoding for multimodal inputs",
    "torchcodec": "10; video/audio decoding",
    # vllm's sampler imports flashinfer unguarded unless VLLM_USE_FLASHINFER_SAMPLER=0, which
    # benchmarks/vllm_device.py sets (seen on the device: ModuleNotFoundError otherwise).
    "flashinfer-python": "14; top-k/top-p sampler and attention backend; FA3 is used on Hopper",
    "fastsafetensors": "optional loader (load_format=fastsafetensors)",
    "fastapi-cli": "CLI only", "fastapi-cloud-cli": "CLI only", "rich-toolkit": "CLI only",
    "rignore": "CLI only", "sentry-sdk": "CLI only", "agent-detector": "CLI only",
    "detect-installer": "CLI only", "truststore": "CLI only", "supervisor": "server process manager",
    "pyelftools": "tilelang dependency", "fastar": "CLI only",
}

# Files dropped from the vllm tree: the FA2 library (FA3 is chosen on sm90), the MoE kernels
# (import is wrapped in contextlib.suppress), the Rust frontend binary (server only) and
# deep_gemm builds for other Python minors.
DROP_FROM_VLLM = [
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
    "vllm/_moe_C_stable_libtorch.abi3.so",
    "vllm/vllm-rs",
    "vllm/third_party/deep_gemm/_C.cpython-310-x86_64-linux-gnu.so",
    "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so",
    "vllm/third_party/deep_gemm/_C.cpython-313-x86_64-linux-gnu.so",
    "vllm/third_party/deep_gemm/_C.cpython-314-x86_64-linux-gnu.so",
]

PLATFORMS = ["manylinux2014_x86_64", "manylinux1_x86_64", "manylinux2010_x86_64", "linux_x86_64"] + [
    f"manylinux_2_{n}_x86_64" for n in range(5, 40)
]


def run(cmd: list[str]) -> None:
    print("+", " ".join(cmd[:8]), "..." if len(cmd) > 8 else "", flush=True)
    subprocess.run(cmd, check=True)


def download(py: str) -> None:
    WHEELS.mkdir(exist_ok=True)
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    run([py, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
         "--implementation", "cp", *plat, "-d", str(WHEELS), VLLM, *CARRIED])


def wheel_files() -> list[Path]:
    wanted = {n.split("==")[0].replace("-", "_").lower() for n in [VLLM, *CARRIED]}
    out = [w for w in sorted(WHEELS.glob("*.whl")) if w.name.split("-")[0].lower() in wanted]
    missing = wanted - {w.name.split("-")[0].lower() for w in out}
    if missing:
        raise SystemExit(f"wheels missing from {WHEELS}: {sorted(missing)}")
    return out


def build(py: str) -> Path:
    site = BUILD / "site"
    shutil.rmtree(site, ignore_errors=True)
    run([py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target", str(site),
         *map(str, wheel_files())])
    for rel in DROP_FROM_VLLM:
        p = site / rel
        p.unlink() if p.is_file() else shutil.rmtree(p, ignore_errors=True)
    shutil.rmtree(site / "bin", ignore_errors=True)  # console scripts point at this machine's python
    archive = BUILD / "vsite.tar.xz"
    run(["bash", "-c", f"set -o pipefail; tar -C {site} -cf - . | xz -T0 -6 > {archive}"])
    return archive


def split(archive: Path) -> list[Path]:
    shutil.rmtree(PIECES, ignore_errors=True)
    data = archive.read_bytes()
    pieces = []
    for i in range(0, len(data), PIECE_BYTES):
        d = PIECES / f"{i // PIECE_BYTES:02d}"
        d.mkdir(parents=True)
        p = d / f"vsite.tar.xz.{i // PIECE_BYTES:02d}"
        p.write_bytes(data[i : i + PIECE_BYTES])
        pieces.append(p)
    manifest = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "pieces": len(pieces)}
    (PIECES / pieces[-1].parent.name / "manifest.json").write_text(json.dumps(manifest))
    print(json.dumps(manifest))
    return pieces


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", default="/root/.pyenv/versions/3.12.1/bin/python3.12",
                    help="a Python 3.12 (same minor as the device) to run pip with")
    ap.add_argument("--skip-download", action="store_true")
    a = ap.parse_args()
    if not a.skip_download:
        download(a.python)
    total = sum(w.stat().st_size for w in wheel_files())
    print(f"carried wheels: {len(wheel_files())} files, {total / 2**20:.1f} MiB as wheels")
    archive = build(a.python)
    print(f"archive {archive}: {archive.stat().st_size / 2**20:.1f} MiB")
    for p in split(archive):
        print(f"{p.relative_to(ROOT)}  {p.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    sys.exit(main())
