package tagging

import (
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

// FuzzClientIP: whatever r.RemoteAddr holds, the remote_address tag is either omitted or an
// IP in canonical form: no port, no zone (which is free text), no IPv4-mapped form, only hex
// digits, '.' and ':', at most as long as an IPv6 address, and read back as itself. An address
// joined with a port reads back as the address.
func FuzzClientIP(f *testing.F) {
	for _, s := range []string{
		"203.0.113.5:4321", "203.0.113.5", "[2001:db8::1]:443", "2001:db8::1", "[fe80::1%eth0]:443",
		"fe80::1%secret@host", "[::ffff:203.0.113.5]:443", "::ffff:203.0.113.5", "[::]:0", "@", "",
		"1.2.3.4:5:6", "[1.2.3.4]:5", "01.2.3.4", "1.2.3.4%eth0", "[::1]", "[::1]:", ":80", "localhost:80",
		"::ffff:0:0", "[64:ff9b::192.0.2.33]:1", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
	} {
		f.Add(s, []byte{32: 0}, uint16(443), "eth0")
	}
	f.Fuzz(func(t *testing.T, remote string, addr []byte, port uint16, zone string) {
		ip, ok := clientIP(remote)
		checkClientIP(t, remote, ip, ok)
		if ok {
			if again, ok := clientIP(ip); !ok || again != ip {
				t.Fatalf("clientIP(%q) = %q, which reads back as %q, %t", remote, ip, again, ok)
			}
		}

		// The round trip: an address of 4 or 16 bytes, with a zone on IPv6, with a port or not.
		var a netip.Addr
		if len(addr) >= 16 {
			a = netip.AddrFrom16([16]byte(addr[:16]))
			if zone != "" && !strings.ContainsAny(zone, "[]") { // an interface name or number
				a = a.WithZone(zone)
			}
		} else if len(addr) >= 4 {
			a = netip.AddrFrom4([4]byte(addr[:4]))
		} else {
			return
		}
		want := a.WithZone("").Unmap().String()
		for _, in := range []string{a.String(), net.JoinHostPort(a.String(), strconv.Itoa(int(port)))} {
			ip, ok := clientIP(in)
			checkClientIP(t, in, ip, ok)
			if !ok || ip != want {
				t.Fatalf("clientIP(%q) = %q, %t; want %q", in, ip, ok, want)
			}
		}
	})
}

// checkClientIP asserts what holds of any clientIP result.
func checkClientIP(t *testing.T, remote, ip string, ok bool) {
	t.Helper()
	if !ok {
		if ip != "" {
			t.Fatalf("clientIP(%q) = %q with no IP", remote, ip)
		}
		return
	}
	if len(ip) > len("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff") || strings.Trim(ip, "0123456789abcdef.:") != "" {
		t.Fatalf("clientIP(%q) = %q: not an IP's text", remote, ip)
	}
	a, err := netip.ParseAddr(ip)
	if err != nil || a.Zone() != "" || a.Is4In6() || a.String() != ip {
		t.Fatalf("clientIP(%q) = %q: not a canonical IP without zone", remote, ip)
	}
}
