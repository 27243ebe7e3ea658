#!/bin/bash
# Builds the lab's proxy test image: a bootable Debian 12 qcow2 from Debian packages alone.
#   build-image.sh OUT.qcow2        (root; needs mmdebstrap, grub-pc-bin, fdisk, e2fsprogs, qemu-utils)
# Debian's full kernel (linux-image-amd64): the cloud kernel lacks AHCI, and the spec's seed is a SATA
# cdrom. cloud-init reads NoCloud only; qemu-guest-agent reports the IP; tinyproxy is the proxy (the
# VMs have no internet, so everything they run is in here). No loop device or mount: mke2fs -d writes
# the root fs into a partition of a raw file, GRUB's boot.img and core.img are written in with dd.
# The lab caches the result keyed by this file's sha256: editing this recipe rebuilds the image.
set -euo pipefail
out=$1
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECMIRROR=${SECMIRROR:-http://deb.debian.org/debian-security}
KERNEL=linux-image-amd64
work=$(mktemp -d "$(dirname "$out")/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
uuid=$(cat /proc/sys/kernel/random/uuid)
start=$(date +%s)

mmdebstrap --mode=root --variant=minbase \
  --aptopt='APT::Install-Recommends "false"' \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-include=/usr/share/locale/locale.alias' \
  --include="systemd-sysv,udev,$KERNEL,initramfs-tools,zstd" \
  --include=cloud-init,cloud-guest-utils,ifupdown,isc-dhcp-client,iproute2,netbase,locales \
  --include=qemu-guest-agent,tinyproxy,procps,less \
  --essential-hook='mkdir -p "$1/etc/initramfs-tools/conf.d"; echo COMPRESS=zstd > "$1/etc/initramfs-tools/conf.d/zstd"' \
  --customize-hook="echo 'UUID=$uuid / ext4 errors=remount-ro 0 1' > \"\$1/etc/fstab\"" \
  --customize-hook='printf "auto lo\niface lo inet loopback\n\nsource /etc/network/interfaces.d/*\n" > "$1/etc/network/interfaces"' \
  --customize-hook='printf "datasource_list: [ NoCloud, None ]\n" > "$1/etc/cloud/cloud.cfg.d/90_dpkg.cfg"' \
  --customize-hook='printf "ssh_genkeytypes: []\n" > "$1/etc/cloud/cloud.cfg.d/91_no_sshd.cfg"' \
  --customize-hook='echo "en_US.UTF-8 UTF-8" > "$1/etc/locale.gen"; chroot "$1" locale-gen >/dev/null; echo LANG=en_US.UTF-8 > "$1/etc/default/locale"' \
  --customize-hook='echo localhost > "$1/etc/hostname"; : > "$1/etc/machine-id"; rm -f "$1/var/lib/dbus/machine-id"' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/*.log' \
  bookworm "$root" \
  "deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" "deb $SECMIRROR bookworm-security main" \
  2> "$work/mmdebstrap.log" || { tail -30 "$work/mmdebstrap.log" >&2; exit 1; }
echo "mmdebstrap done after $(( $(date +%s) - start ))s"

kver=$(basename "$(ls "$root"/boot/vmlinuz-* | sort -V | tail -1)")
kver=${kver#vmlinuz-}
truncate -s 2G "$work/disk.raw"
printf 'label: dos\nstart=2048, type=83, bootable\n' | sfdisk -q "$work/disk.raw"
sectors=$(sfdisk -l -o Sectors "$work/disk.raw" | tail -1 | tr -d ' ')
mke2fs -q -t ext4 -L root -U "$uuid" -O ^metadata_csum_seed,^orphan_file -E offset=$((2048 * 512)) \
  -d "$root" "$work/disk.raw" $((sectors / 2))k
cat > "$work/early.cfg" <<GRUB
set root=(hd0,msdos1)
linux /boot/vmlinuz-$kver root=UUID=$uuid ro console=tty0 console=ttyS0,115200n8
initrd /boot/initrd.img-$kver
boot
GRUB
grub-mkimage -O i386-pc -o "$work/core.img" -p '(hd0,msdos1)/boot/grub' -c "$work/early.cfg" \
  biosdisk part_msdos ext2 linux boot
[ "$(stat -c %s "$work/core.img")" -lt $((2047 * 512)) ] || { echo "core.img too big for the MBR gap" >&2; exit 1; }
dd if=/usr/lib/grub/i386-pc/boot.img of="$work/disk.raw" bs=440 count=1 conv=notrunc status=none
dd if="$work/core.img" of="$work/disk.raw" bs=512 seek=1 conv=notrunc status=none
qemu-img convert -c -O qcow2 "$work/disk.raw" "$work/out.qcow2"
mv "$work/out.qcow2" "$out"
echo "built $out ($(du -m "$out" | cut -f1) MiB, kernel $kver) in $(( $(date +%s) - start ))s"
