"""The image scripts/build-image.sh built (LACE_IMAGE, archive LACE_IMAGE_ARCHIVE), checked from
the inside: its root is mounted with `buildah mount` and the checks run in it with chroot (no
container runtime can start containers here). Prints the image's size."""

import hashlib
import json
import os
import pathlib
import subprocess
import tarfile

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
IMAGE = os.environ["LACE_IMAGE"]
ARCHIVE = pathlib.Path(os.environ["LACE_IMAGE_ARCHIVE"])
CHART = yaml.safe_load((ROOT / "chart/Chart.yaml").read_text())
VERSION = CHART["appVersion"]
SIZE_TARGET = 60 * 1000 * 1000
ELF_MACHINE = {"amd64": 62, "arm64": 183}  # EM_X86_64, EM_AARCH64


def run(*args, **kw):
    return subprocess.run(args, capture_output=True, text=True, check=True, **kw).stdout


@pytest.fixture(scope="module")
def rootfs():
    container = run("buildah", "from", "--pull-never", IMAGE).strip()
    try:
        yield pathlib.Path(run("buildah", "mount", container).strip())
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True)


@pytest.fixture(scope="module")
def config():
    return json.loads(run("buildah", "inspect", "--type", "image", IMAGE))["OCIv1"]


def chroot(root, *args, user=None, stdin=None, env=None):
    cmd = ["chroot"] + ([f"--userspec={user}"] if user else []) + [str(root), *args]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env)


def test_the_binaries_run_and_say_the_charts_version(rootfs):
    for binary in ("lace-agent", "lace-controller"):
        out = chroot(rootfs, f"/usr/local/bin/{binary}", "--version")
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == f"{binary} {VERSION}"
    # The CNI plugin as containerd runs it: CNI_COMMAND=VERSION, nothing else needed.
    out = chroot(rootfs, "/usr/local/bin/lace", stdin="{}",
                 env={"CNI_COMMAND": "VERSION", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "1.1.0" in json.loads(out.stdout)["supportedVersions"]


def test_the_plugin_runs_on_a_host_without_the_images_libraries(rootfs, tmp_path):
    # The agent copies `lace` into the host's CNI bin dir, where the host's libc (any version,
    # or none the binary was linked against) is what a dynamic binary would get: the plugin is
    # static, so a root holding nothing but the plugin runs it.
    empty = tmp_path / "root"
    empty.mkdir()
    plugin = empty / "lace"
    plugin.write_bytes((rootfs / "usr/local/bin/lace").read_bytes())
    plugin.chmod(0o755)
    out = chroot(empty, "/lace", stdin="{}",
                 env={"CNI_COMMAND": "VERSION", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    assert out.returncode == 0, f"the plugin does not run without the image's libraries: {out.stderr}"
    assert "1.1.0" in json.loads(out.stdout)["supportedVersions"]


def test_the_controller_runs_as_the_images_non_root_user(rootfs, config):
    assert config["config"]["User"] == "65532:65532"
    passwd = (rootfs / "etc/passwd").read_text()
    assert "nonroot:x:65532:65532:" in passwd
    out = chroot(rootfs, "/usr/local/bin/lace-controller", "--version", user="65532:65532")
    assert out.returncode == 0, out.stderr


def test_nft_and_ip_work_as_the_agent_uses_them(rootfs):
    assert chroot(rootfs, "/usr/sbin/nft", "--version").stdout.startswith("nftables v")
    assert "iproute2" in chroot(rootfs, "/bin/ip", "-V").stdout
    # The planner's real ruleset, checked by the image's nft against the kernel, in a network
    # namespace of its own (nothing is applied: -c).
    ruleset = (ROOT / "tests/golden/node-1.nft").read_text()
    out = subprocess.run(["unshare", "--net", "chroot", str(rootfs), "/usr/sbin/nft", "-c", "-f", "-"],
                         input=ruleset, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    # JSON, the way the nftables crate drives it.
    out = subprocess.run(["unshare", "--net", "chroot", str(rootfs), "/usr/sbin/nft", "-j",
                          "list", "ruleset"], capture_output=True, text=True)
    assert out.returncode == 0 and json.loads(out.stdout)["nftables"], out.stderr
    links = json.loads(subprocess.run(["unshare", "--net", "chroot", str(rootfs), "/bin/ip", "-j",
                                       "link"], capture_output=True, text=True).stdout)
    assert [link["ifname"] for link in links] == ["lo"]


def test_the_binaries_are_for_the_images_architecture(rootfs, config):
    arch = config["architecture"]
    assert config["os"] == "linux" and arch in ELF_MACHINE
    for binary in ("lace-agent", "lace-controller", "lace", "../../sbin/nft"):
        header = (rootfs / "usr/local/bin" / binary).resolve().read_bytes()[:20]
        assert header[:4] == b"\x7fELF"
        assert int.from_bytes(header[18:20], "little") == ELF_MACHINE[arch], binary


def test_nothing_the_image_does_not_need(rootfs):
    # No shell, no package manager, no interpreter: the agent execs only nft.
    for path in ("bin/sh", "bin/bash", "usr/bin/apt", "usr/bin/dpkg", "usr/bin/perl",
                 "usr/bin/python3", "usr/share/doc", "usr/share/man", "var/lib/apt"):
        assert not (rootfs / path).exists(), path
    # But the packages it holds are recorded for image scanners.
    recorded = {p.name for p in (rootfs / "var/lib/dpkg/status.d").iterdir()
                if not p.name.endswith(".list")}
    assert {"nftables", "iproute2", "libc6", "libnftables1"} <= recorded
    assert "debconf" not in recorded


def test_labels_follow_the_oci_image_spec(config):
    labels = config["config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.title"] == "lace-cni"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    revision = run("git", "-C", str(ROOT), "rev-parse", "HEAD").strip()
    assert labels["org.opencontainers.image.revision"] == revision
    for key in ("created", "source", "description"):
        assert labels[f"org.opencontainers.image.{key}"], key
    assert not [k for k in labels if not k.startswith("org.opencontainers.image.")]


def test_the_charts_default_image_is_what_the_build_tags():
    out = subprocess.run([str(ROOT / ".cache/bin/helm3"), "template", "lace", str(ROOT / "chart"),
                          "--kube-version", "1.33.0"], capture_output=True, text=True, check=True)
    images = {c["image"] for d in yaml.safe_load_all(out.stdout) if d and d["kind"] in
              ("Deployment", "DaemonSet") for c in d["spec"]["template"]["spec"]["containers"]}
    assert images == {IMAGE}


def test_the_archive_is_a_complete_oci_layout_named_by_the_tag(rootfs):
    with tarfile.open(ARCHIVE) as tar:
        names = set(tar.getnames())
        assert "oci-layout" in names
        index = json.load(tar.extractfile("index.json"))
        [entry] = index["manifests"]
        # `ctr images import` and `kind load image-archive` name the image after this.
        assert entry["annotations"]["org.opencontainers.image.ref.name"] == IMAGE

        def blob(descriptor):
            data = tar.extractfile("blobs/sha256/" + descriptor["digest"].split(":")[1]).read()
            assert hashlib.sha256(data).hexdigest() == descriptor["digest"].split(":")[1]
            assert len(data) == descriptor["size"]
            return data
        manifest = json.loads(blob(entry))
        config = json.loads(blob(manifest["config"]))
        assert config["architecture"] in ELF_MACHINE
        compressed = sum(len(blob(layer)) for layer in manifest["layers"])
    unpacked = int(run("du", "-sb", str(rootfs)).split()[0])
    print(f"\nimage {IMAGE}: {unpacked / 1e6:.1f} MB unpacked, {compressed / 1e6:.1f} MB "
          f"compressed ({len(manifest['layers'])} layers), target under {SIZE_TARGET / 1e6:.0f} MB")
    assert unpacked < SIZE_TARGET
