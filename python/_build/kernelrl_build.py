"""The package's own build backend (PEP 517 and 660), in the tree: `pip install ./python` builds
with nothing to download and writes only the wheel it is asked for, into pip's own folder (no
build/ or egg-info beside the sources). The metadata is pyproject.toml's [project] table."""

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
PACKAGE = "kernelrl"
TAG = "py3-none-any"
EPOCH = (2020, 1, 1, 0, 0, 0)  # every archive entry's time: the same sources give the same wheel


def _project():
    """pyproject.toml's [project] table (tomllib where Python has it; else its plain lines)."""
    path = os.path.join(HERE, "pyproject.toml")
    try:
        import tomllib
        with open(path, "rb") as f:
            return tomllib.load(f)["project"]
    except ImportError:
        pass
    out, section = {}, ""
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line.startswith("["):
                section = line.strip("[]")
            elif section == "project" and "=" in line:
                key, value = (x.strip() for x in line.split("=", 1))
                m = re.fullmatch(r'"(.*)"', value) or re.fullmatch(r'\{\s*text\s*=\s*"(.*)"\s*\}', value)
                if m:
                    out[key] = {"text": m.group(1)} if value.startswith("{") else m.group(1)
    return out


def _metadata():
    p = _project()
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}",
             f"Summary: {p.get('description', '')}"]
    lic = p.get("license")
    if isinstance(lic, dict) and lic.get("text"):
        lines.append(f"License: {lic['text']}")
    if p.get("requires-python"):
        lines.append(f"Requires-Python: {p['requires-python']}")
    for dep in p.get("dependencies", []) or []:
        lines.append(f"Requires-Dist: {dep}")
    text = "\n".join(lines) + "\n"
    readme = p.get("readme")
    if readme:
        with open(os.path.join(HERE, readme), encoding="utf-8") as f:
            text += "Description-Content-Type: text/markdown\n\n" + f.read()
    return p, text


def _dist_info(p):
    return f"{p['name'].replace('-', '_')}-{p['version']}.dist-info"


def _wheel_name(p):
    return f"{p['name'].replace('-', '_')}-{p['version']}-{TAG}.whl"


def _dist_files(p, metadata):
    info = _dist_info(p)
    wheel = f"Wheel-Version: 1.0\nGenerator: kernelrl_build\nRoot-Is-Purelib: true\nTag: {TAG}\n"
    return [(f"{info}/METADATA", metadata.encode()), (f"{info}/WHEEL", wheel.encode())]


def _write_wheel(directory, files):
    """files: [(archive path, bytes)] -> the wheel at directory, with its RECORD; returns its name."""
    p, metadata = _metadata()
    files = list(files) + _dist_files(p, metadata)
    record = []
    for path, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record_path = f"{_dist_info(p)}/RECORD"
    record.append(f"{record_path},,")
    files.append((record_path, ("\n".join(record) + "\n").encode()))
    name = _wheel_name(p)
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            info = zipfile.ZipInfo(path, EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return name


def _package_files():
    out = []
    root = os.path.join(HERE, PACKAGE)
    for name in sorted(os.listdir(root)):
        if name.endswith(".py"):
            with open(os.path.join(root, name), "rb") as f:
                out.append((f"{PACKAGE}/{name}", f.read()))
    return out


# ---- PEP 517 ----------------------------------------------------------------------------------
def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    p, metadata = _metadata()
    info = os.path.join(metadata_directory, _dist_info(p))
    os.makedirs(info, exist_ok=True)
    for path, data in _dist_files(p, metadata):
        with open(os.path.join(metadata_directory, path), "wb") as f:
            f.write(data)
    return _dist_info(p)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, _package_files())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """PEP 660: a wheel whose .pth puts this folder on sys.path (the sources used in place)."""
    return _write_wheel(wheel_directory, [(f"__editable__.{PACKAGE}.pth", (HERE + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    p = _project()
    base = f"{p['name']}-{p['version']}"
    name = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        for folder, dirs, files in os.walk(HERE):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.endswith(".egg-info") and d != "build")
            for f in sorted(files):
                if f.endswith(".pyc"):
                    continue
                full = os.path.join(folder, f)
                with open(full, "rb") as fh:
                    data = fh.read()
                info = tarfile.TarInfo(os.path.join(base, os.path.relpath(full, HERE)))
                info.size, info.mode, info.mtime = len(data), 0o644, 1577836800
                t.addfile(info, io.BytesIO(data))
    return name
