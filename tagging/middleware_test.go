package tagging

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/internal/bounded"
)

// serve runs one request through h and returns the tags its handler saw.
func serve(t *testing.T, wrap func(http.Handler) http.Handler, r *http.Request) Tags {
	t.Helper()
	var got Tags
	called := false
	h := wrap(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		called = true
		got = From(r.Context())
	}))
	h.ServeHTTP(httptest.NewRecorder(), r)
	if !called {
		t.Fatal("handler not called")
	}
	return got
}

func TestMiddleware(t *testing.T) {
	inMux := func(pattern string) func(http.Handler) http.Handler {
		return func(h http.Handler) http.Handler {
			mux := http.NewServeMux()
			mux.Handle(pattern, Middleware(h))
			return mux
		}
	}
	aroundMux := func(h http.Handler) http.Handler {
		mux := http.NewServeMux()
		mux.Handle("GET /orders/{id}", h)
		return Middleware(mux)
	}
	tests := []struct {
		name   string
		wrap   func(http.Handler) http.Handler
		method string
		target string
		remote string
		header map[string]string
		ctx    context.Context
		want   []pair
	}{
		{"inside mux: route is the pattern's path", inMux("GET /orders/{id}"), "GET", "/orders/42", "203.0.113.5:4321", nil, nil,
			[]pair{{"method", "GET"}, {"remote_address", "203.0.113.5"}, {"route", "/orders/{id}"}}},
		{"pattern with host", inMux("POST example.com/orders/{id}"), "POST", "http://example.com/orders/42", "203.0.113.5:1", nil, nil,
			[]pair{{"method", "POST"}, {"remote_address", "203.0.113.5"}, {"route", "/orders/{id}"}}},
		{"catch-all pattern", inMux("/"), "GET", "/anything/at/all", "203.0.113.5:1", nil, nil,
			[]pair{{"method", "GET"}, {"remote_address", "203.0.113.5"}, {"route", "/"}}},
		{"without mux: route is the URL path", Middleware, "GET", "/orders/42?x=1", "203.0.113.5:1", nil, nil,
			[]pair{{"method", "GET"}, {"remote_address", "203.0.113.5"}, {"route", "/orders/42"}}},
		{"around mux: route is the URL path", aroundMux, "GET", "/orders/42", "203.0.113.5:1", nil, nil,
			[]pair{{"method", "GET"}, {"remote_address", "203.0.113.5"}, {"route", "/orders/42"}}},
		{"non-standard method", Middleware, "PURGE", "/x", "203.0.113.5:1", nil, nil,
			[]pair{{"method", "_OTHER"}, {"remote_address", "203.0.113.5"}, {"route", "/x"}}},
		{"IPv6", Middleware, "GET", "/x", "[2001:db8::1]:443", nil, nil,
			[]pair{{"method", "GET"}, {"remote_address", "2001:db8::1"}, {"route", "/x"}}},
		{"IPv6 zone dropped", Middleware, "GET", "/x", "[fe80::1%eth0]:443", nil, nil,
			[]pair{{"method", "GET"}, {"remote_address", "fe80::1"}, {"route", "/x"}}},
		{"IPv4-mapped unmapped", Middleware, "GET", "/x", "[::ffff:203.0.113.5]:443", nil, nil,
			[]pair{{"method", "GET"}, {"remote_address", "203.0.113.5"}, {"route", "/x"}}},
		{"address without port", Middleware, "GET", "/x", "203.0.113.5", nil, nil,
			[]pair{{"method", "GET"}, {"remote_address", "203.0.113.5"}, {"route", "/x"}}},
		{"no IP: tag omitted", Middleware, "GET", "/x", "@", nil, nil,
			[]pair{{"method", "GET"}, {"route", "/x"}}},
		{"empty remote address: tag omitted", Middleware, "GET", "/x", "", nil, nil,
			[]pair{{"method", "GET"}, {"route", "/x"}}},
		{"X-Forwarded-For not trusted", Middleware, "GET", "/x", "10.0.0.1:1",
			map[string]string{"X-Forwarded-For": "198.51.100.7", "X-Real-Ip": "198.51.100.7"}, nil,
			[]pair{{"method", "GET"}, {"remote_address", "10.0.0.1"}, {"route", "/x"}}},
		{"invalid UTF-8 path: replaced", Middleware, "GET", "/%FF%FE", "10.0.0.1:1", nil, nil,
			[]pair{{"method", "GET"}, {"remote_address", "10.0.0.1"}, {"route", "/\uFFFD"}}},
		{"long path: cut", Middleware, "GET", "/" + strings.Repeat("a", 8<<10), "10.0.0.1:1", nil, nil,
			[]pair{{"method", "GET"}, {"remote_address", "10.0.0.1"}, {"route", "/" + strings.Repeat("a", bounded.ValueLen-1)}}},
		{"merges with request context tags", Middleware, "GET", "/x", "10.0.0.1:1", nil,
			With(context.Background(), "app", "billing", "route", "outer"),
			[]pair{{"app", "billing"}, {"method", "GET"}, {"remote_address", "10.0.0.1"}, {"route", "/x"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(tt.method, tt.target, nil)
			if tt.ctx != nil {
				r = r.WithContext(tt.ctx)
			}
			r.RemoteAddr = tt.remote
			for k, v := range tt.header {
				r.Header.Set(k, v)
			}
			assertTags(t, serve(t, tt.wrap, r), tt.want)
		})
	}
}

// A handler behind a trusted proxy overrides remote_address with With.
func TestMiddlewareLaterWithWins(t *testing.T) {
	r := httptest.NewRequest("GET", "/x", nil)
	r.RemoteAddr = "10.0.0.1:1"
	var got Tags
	h := Middleware(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		got = From(With(r.Context(), "remote_address", "198.51.100.7"))
	}))
	h.ServeHTTP(httptest.NewRecorder(), r)
	if v, _ := got.Get("remote_address"); v != "198.51.100.7" {
		t.Errorf("remote_address = %q, want the handler's 198.51.100.7", v)
	}
}

func BenchmarkMiddleware(b *testing.B) {
	mux := http.NewServeMux()
	mux.Handle("GET /orders/{id}", Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	r := httptest.NewRequest("GET", "/orders/42", nil)
	w := httptest.NewRecorder()
	b.ReportAllocs()
	for b.Loop() {
		mux.ServeHTTP(w, r)
	}
}
