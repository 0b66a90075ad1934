package nettest

// Hand-made packets, for tests that play a hostile host: an IPv4/UDP
// packet with any source (the inner packet of a forged tunnel packet) and
// a VXLAN frame carrying one.

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// IPv4UDP is an IPv4 packet (TTL 64, no options) carrying UDP from
// src:sport to dst:dport, with header checksum; the UDP checksum is 0
// (none, which IPv4 allows).
func IPv4UDP(src, dst netip.Addr, sport, dport int, payload []byte) []byte {
	const ihl, udpLen = 20, 8
	p := make([]byte, ihl+udpLen+len(payload))
	p[0] = 0x45
	binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	p[8] = 64 // TTL
	p[9] = 17 // UDP
	s, d := src.As4(), dst.As4()
	copy(p[12:16], s[:])
	copy(p[16:20], d[:])
	binary.BigEndian.PutUint16(p[10:], ipChecksum(p[:ihl]))
	u := p[ihl:]
	binary.BigEndian.PutUint16(u[0:], uint16(sport))
	binary.BigEndian.PutUint16(u[2:], uint16(dport))
	binary.BigEndian.PutUint16(u[4:], uint16(udpLen+len(payload)))
	copy(u[udpLen:], payload)
	return p
}

func ipChecksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// VXLANFrame is the UDP payload of a VXLAN packet: the VXLAN header with
// vni, then an Ethernet frame from srcMAC to dstMAC carrying the IPv4
// packet ip.
func VXLANFrame(vni int, dstMAC, srcMAC net.HardwareAddr, ip []byte) []byte {
	f := make([]byte, 8+14+len(ip))
	f[0] = 0x08 // I flag: the VNI is valid
	f[4], f[5], f[6] = byte(vni>>16), byte(vni>>8), byte(vni)
	copy(f[8:14], dstMAC)
	copy(f[14:20], srcMAC)
	binary.BigEndian.PutUint16(f[20:], 0x0800)
	copy(f[22:], ip)
	return f
}
