# kernel.sh - sourced by vmrun.sh and netns-tests/run: which Debian kernel a VM boots.
#
# lace_kernel_resolve K   prints the installed kernel version for K on stdout, where K is
#   6.1 | 6.12 (newest installed 6.1.x / 6.12.x *-amd64) or a full version (6.12.117+deb12-amd64).
#   When that kernel's /boot/vmlinuz or /lib/modules tree is missing it prints a readable error
#   naming the package to install, and returns 1.

# The Debian package that provides kernel K (for error messages).
lace_kernel_package() {
  case $1 in
    6.1) echo linux-image-amd64;;
    [0-9]*.[0-9]*-*) echo "linux-image-$1";;
    *) echo "linux-image-$1-amd64";;
  esac
}

lace_kernel_resolve() {
  local k=${1:?kernel version} found= v
  case $k in
    *-*)  # a full version string
      [ -f "/boot/vmlinuz-$k" ] && found=$k;;
    [0-9]*.[0-9]*)
      # "6.1" must not match 6.12: require "<k>." then digits; pick the newest.
      for v in /boot/vmlinuz-"$k".*-amd64; do
        [ -f "$v" ] || continue
        v=${v#/boot/vmlinuz-}
        case ${v#"$k".} in [0-9]*) ;; *) continue;; esac
        found=$(printf '%s\n' "$found" "$v" | sed '/^$/d' | sort -V | tail -1)
      done;;
    *)
      echo "kernel: '$k' is not a kernel version (use 6.1, 6.12 or a full version like 6.1.0-57-amd64)" >&2
      return 1;;
  esac
  if [ -z "$found" ]; then
    echo "" >&2
    echo "  ERROR: no Debian kernel $k installed (/boot/vmlinuz-$k* missing)." >&2
    echo "  Install it with:  apt-get install $(lace_kernel_package "$k")   (or run netns-tests/vm/setup.sh)" >&2
    echo "" >&2
    return 1
  fi
  if [ ! -f "/lib/modules/$found/modules.dep" ]; then
    echo "  ERROR: kernel $found has no module tree (/lib/modules/$found/modules.dep missing);" >&2
    echo "  reinstall it:  apt-get install --reinstall $(lace_kernel_package "$k")" >&2
    return 1
  fi
  echo "$found"
}
