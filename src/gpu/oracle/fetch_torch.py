"""Fetches the part of a torch release the oracle needs, and nothing else.

The oracle links `libc10_cuda.so` and `libc10.so` and compiles against c10's headers and CUDA
runtime headers; a torch wheel is 0.5-0.9 GB, those parts a few MB. A wheel is a zip file, whose
table of contents sits at its end, so HTTP range requests read the table and then each member
wanted: no pip, no dependencies, no whole download.

    python3 fetch_torch.py torch VERSION DEST [--index URL]
        DEST/torch/{lib,include,version.py} from the x86_64 Linux wheel of torch VERSION
    python3 fetch_torch.py cuda-headers MAJOR DEST [--index URL]
        DEST/include: the CUDA MAJOR runtime headers (with crt/) that a triton wheel bundles

DEST appears whole or not at all. The index is PEP 691 JSON or PEP 503 HTML (`--index`, else
$PIP_INDEX_URL, else PyPI). Errors are one line on stderr, exit status 1.
"""

import argparse
import html.parser
import io
import json
import os
import re
import shutil
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile

# The members the oracle needs, by prefix.
TORCH_MEMBERS = (
    "torch/lib/libc10.so",
    "torch/lib/libc10_cuda.so",
    "torch/include/c10/",
    "torch/include/torch/headeronly/",
    "torch/version.py",
)
TRITON_HEADERS = "triton/backends/nvidia/include/"
# A triton release whose bundled headers are those of each CUDA major: a torch's own triton
# need not match its CUDA (torch 2.11's cu130 wheel requires triton 3.6, whose are CUDA 12.8),
# and declarations must match the runtime the fake stands in for.
TRITON_FOR_CUDA = {"12": "3.5.0", "13": "3.9.0"}
PLATFORM = re.compile(r"-manylinux[^-]*_x86_64\.whl$")


class Fail(Exception):
    pass


def fetch(url, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.read(), r.headers
    except urllib.error.HTTPError as e:
        raise Fail(f"{url}: HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        raise Fail(f"{url}: {getattr(e, 'reason', e)}") from None


class RemoteFile(io.RawIOBase):
    """A read-only, seekable view of a file on a server that answers range requests."""

    def __init__(self, url):
        self.url, self.pos = url, 0
        req = urllib.request.Request(url, method="HEAD")
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                self.size = int(r.headers["Content-Length"])
                if r.headers.get("Accept-Ranges", "bytes") != "bytes":
                    raise Fail(f"{url}: the server does not answer range requests")
        except urllib.error.HTTPError as e:
            raise Fail(f"{url}: HTTP {e.code}") from None
        except (urllib.error.URLError, OSError) as e:
            raise Fail(f"{url}: {getattr(e, 'reason', e)}") from None

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, offset, whence=0):
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def readinto(self, buf):
        n = min(len(buf), self.size - self.pos)
        if n <= 0:
            return 0
        data, _ = fetch(self.url, {"Range": f"bytes={self.pos}-{self.pos + n - 1}"})
        if len(data) != n:
            raise Fail(f"{self.url}: asked for {n} bytes at {self.pos}, got {len(data)}")
        buf[:n] = data
        self.pos += n
        return n


class Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links = []

    def handle_starttag(self, tag, attrs):
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.links.append(href)


def wheel_urls(index, project):
    """(filename, url) of every file the index lists for `project`."""
    page = f"{index.rstrip('/')}/{project}/"
    body, headers = fetch(page, {"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
    if "json" in headers.get("Content-Type", ""):
        return [(f["filename"], urllib.parse.urljoin(page, f["url"])) for f in json.loads(body)["files"]]
    parser = Links()
    parser.feed(body.decode("utf-8", "replace"))
    out = []
    for href in parser.links:
        url = urllib.parse.urljoin(page, href)
        out.append((urllib.parse.unquote(url.split("#")[0].rsplit("/", 1)[-1]), url))
    return out


def pick_wheel(index, project, version):
    ours = [
        (name, url)
        for name, url in wheel_urls(index, project)
        if name.startswith(f"{project}-{version}-") and PLATFORM.search(name)
    ]
    if not ours:
        raise Fail(f"no Linux x86_64 wheel of {project} {version} on {index} (is {version} a released version?)")
    # Every Python tag carries the same libraries; the first is as good as any.
    return sorted(ours)[0]


def extract(url, prefixes, dest):
    """Writes the members of the wheel at `url` under any of `prefixes` into `dest`; returns their names."""
    with zipfile.ZipFile(io.BufferedReader(RemoteFile(url), 1 << 20)) as z:
        names = [n for n in z.namelist() if n.startswith(prefixes) and not n.endswith("/")]
        for name in names:
            target = os.path.join(dest, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(name) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
        return names


def fetch_torch(version, index, work):
    name, url = pick_wheel(index, "torch", version)
    print(f"fetching torch {version}'s c10 libraries and headers from {name}", file=sys.stderr)
    names = extract(url, TORCH_MEMBERS, work)
    if "torch/lib/libc10_cuda.so" not in names:
        raise Fail(f"{name} has no torch/lib/libc10_cuda.so: not a CUDA build of torch")


def fetch_cuda_headers(major, index, work):
    if major not in TRITON_FOR_CUDA:
        raise Fail(f"no source known for CUDA {major} headers (known: {', '.join(TRITON_FOR_CUDA)})")
    name, url = pick_wheel(index, "triton", TRITON_FOR_CUDA[major])
    print(f"fetching CUDA {major} runtime headers from {name}", file=sys.stderr)
    names = extract(url, (TRITON_HEADERS,), work)
    api = TRITON_HEADERS + "cuda_runtime_api.h"
    if api not in names:
        raise Fail(f"{name} has no {api}")
    os.rename(os.path.join(work, TRITON_HEADERS), os.path.join(work, "include"))
    shutil.rmtree(os.path.join(work, "triton"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["torch", "cuda-headers"])
    ap.add_argument("version")
    ap.add_argument("dest")
    ap.add_argument("--index", default=os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple")
    args = ap.parse_args()
    if os.path.isdir(args.dest):
        return
    parent = os.path.dirname(os.path.abspath(args.dest))
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".fetch-", dir=parent)
    try:
        if args.what == "torch":
            fetch_torch(args.version, args.index, work)
        else:
            fetch_cuda_headers(args.version, args.index, work)
        try:
            os.rename(work, args.dest)
        except OSError:
            # Another process fetched the same release meanwhile: theirs is as good.
            if not os.path.isdir(args.dest):
                raise
            shutil.rmtree(work, ignore_errors=True)
    except Fail as e:
        shutil.rmtree(work, ignore_errors=True)
        print(f"cannot fetch {args.what} {args.version}: {e}", file=sys.stderr)
        sys.exit(1)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


if __name__ == "__main__":
    main()
