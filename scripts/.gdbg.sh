set -e
python3 -m pip install -q --no-index --no-deps --target /tmp/kernelrl-site .deps/gpu/wheels/*.whl .deps/gpu-py/*.whl
export PYTHONPATH=/tmp/kernelrl-site
torch_lib="$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
export LD_LIBRARY_PATH=".deps/gpu/lib:$torch_lib"
python3 - <<'PY'
import sys, os, json, subprocess
sys.path.insert(0, "bench")
import policy_throughput as pt
d = pt.make_model("qwen2", "tiny", "/tmp/dbg-model")
prompts = ["def forward(self, x):", "__global__ void add(float* a, const float* b) {", "x"]
res = {}
for mode in ["0", "static", "1"]:
    for cap_extra in ["48", "40"]:
        args = [".deps/gpu/launch", "generate", "--model", d, "--device", "cuda:0", "--dtype", "f32", "--temperature", "0", "--max-tokens", cap_extra, "--json"]
        for p in prompts: args += ["--prompt", p]
        out = subprocess.run(args, capture_output=True, text=True, env=dict(os.environ, KERNELRL_CUDA_GRAPHS=mode))
        if out.returncode: print(mode, out.stderr[:500]); continue
        res[(mode, cap_extra)] = [c["token_ids"] for c in json.loads(out.stdout)["completions"]]
for k, v in res.items():
    base = res.get(("0", k[1]))
    print(k, [pt.first_divergence(a, b) for a, b in zip(v, base)])
# single prompt, no padding
for mode in ["0", "1"]:
    args = [".deps/gpu/launch", "generate", "--model", d, "--device", "cuda:0", "--dtype", "f32", "--temperature", "0", "--max-tokens", "48", "--json", "--prompt", prompts[1]]
    out = subprocess.run(args, capture_output=True, text=True, env=dict(os.environ, KERNELRL_CUDA_GRAPHS=mode))
    res[("single", mode)] = json.loads(out.stdout)["completions"][0]["token_ids"]
print("single prompt graph vs eager", pt.first_divergence(res[("single","1")], res[("single","0")]))
PY
