package tagging

import (
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/pgtraffic/pgtraffic/internal/bounded"
)

// Middleware returns a handler that tags each request's context, merged
// onto any tags it already carries, and then calls next:
//
//   - route: the path of the [net/http.ServeMux] pattern that matched, such
//     as "/orders/{id}" for the pattern "GET /orders/{id}" (method and host
//     are dropped: the method has its own tag). The mux sets the pattern only
//     on requests it hands to a registered handler, so register Middleware
//     inside the mux, per route. Outside a mux, or wrapped around one, the
//     route is the decoded URL path, whose cardinality is as high as clients
//     care to make it: avoid per-route budgets then. Either is cut to 256
//     bytes and its invalid UTF-8 (a request for "/%FF") replaced by U+FFFD.
//   - method: the request method, or "_OTHER" for a method outside the
//     standard set, as OpenTelemetry records it, so that clients cannot mint
//     tag values at will.
//   - remote_address: the client IP from r.RemoteAddr, without port or IPv6
//     zone and with IPv4-mapped IPv6 addresses unmapped, so CIDR rules match.
//     Omitted when RemoteAddr holds no IP (a Unix socket, say).
//
// X-Forwarded-For and similar headers are not read: any client can send
// them, so trusting them by default would let a client escape a per-address
// budget or charge its queries to someone else's. Behind a proxy you trust,
// set the tag from the header yourself (a later [With] of remote_address
// wins), or rewrite r.RemoteAddr in a middleware that runs before this one.
func Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kv := make([]string, 0, 6)
		kv = append(kv, "route", route(r), "method", method(r.Method))
		if ip, ok := clientIP(r.RemoteAddr); ok {
			kv = append(kv, "remote_address", ip)
		}
		next.ServeHTTP(w, r.WithContext(With(r.Context(), kv...)))
	})
}

// route returns the path part of the matched mux pattern, or the URL path,
// as bounded text: the path is the client's to choose.
func route(r *http.Request) string {
	if p := r.Pattern; p != "" {
		// A pattern is "[METHOD ][HOST]/[PATH]": neither method nor host holds
		// a '/', so the path starts at the first one.
		if i := strings.IndexByte(p, '/'); i >= 0 {
			p = p[i:]
		}
		return bounded.Text(p, bounded.ValueLen)
	}
	if r.URL != nil {
		return bounded.Text(r.URL.Path, bounded.ValueLen)
	}
	return ""
}

func method(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return m
	case "":
		return http.MethodGet // net/http's client and server read "" as GET
	}
	return "_OTHER"
}

// clientIP returns the IP of a "host:port" remote address in canonical form.
func clientIP(remote string) (string, bool) {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote // no port
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return "", false
	}
	return ip.WithZone("").Unmap().String(), true
}
