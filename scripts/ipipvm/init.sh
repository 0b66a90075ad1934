#!/bin/sh
# /init of the IPIP test VM (scripts/ipipvm/mkinitramfs.sh puts it there).
# Mounts the pseudo file systems, loads the modules listed in
# /etc/ipipvm/modules (the NIC driver: there is no udev to do it), runs
# /ipipvm/guest, which prints the test's PASS/FAIL marker, and powers off.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
/bin/busybox mkdir -p /proc /sys /dev /run /tmp /usr/bin /usr/sbin
/bin/busybox --install -s
mount -t devtmpfs devtmpfs /dev 2>/dev/null
# Without /dev/console in the archive (built as non-root) the kernel could
# not open a console for us: take it now.
[ -t 1 ] || exec </dev/console >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mkdir -p /run/netns
ln -sfn /run /var/run 2>/dev/null
echo "ipipvm-init: kernel $(uname -r), userspace at $(cut -d' ' -f1 /proc/uptime)s, clock $(date -u +%FT%TZ)"
for m in $(cat /etc/ipipvm/modules 2>/dev/null); do
	modprobe "$m" || echo "ipipvm-init: modprobe $m failed"
done
/ipipvm/guest
echo "ipipvm-init: guest exited with status $? at $(cut -d' ' -f1 /proc/uptime)s"
poweroff -f
