package tagging_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/pgtraffic/pgtraffic/tagging"
)

func ExampleWith() {
	ctx := tagging.With(context.Background(), "app", "billing", "tenant", "7")
	// Later tags merge onto earlier ones; the newer value of a key wins.
	ctx = tagging.With(ctx, "tenant", "42", "controller", "invoices")

	for k, v := range tagging.From(ctx).All() {
		fmt.Printf("%s=%s\n", k, v)
	}
	// Output:
	// app=billing
	// controller=invoices
	// tenant=42
}

func ExampleFrom() {
	tags := tagging.From(tagging.With(context.Background(), "app", "billing"))
	app, ok := tags.Get("app")
	fmt.Println(app, ok, tags.Len())

	_, ok = tagging.From(context.Background()).Get("app")
	fmt.Println(ok)
	// Output:
	// billing true 1
	// false
}

func ExampleAppend() {
	tags := tagging.New("route", "/orders/{id}", "app", "billing")
	fmt.Println(tagging.Append("SELECT * FROM orders WHERE id = $1;", tags))
	// A statement that already has a comment is left alone, as the spec requires.
	fmt.Println(tagging.Append("SELECT 1 /* keep me */", tags))
	// Output:
	// SELECT * FROM orders WHERE id = $1 /*app='billing',route='%2Forders%2F%7Bid%7D'*/;
	// SELECT 1 /* keep me */
}

func ExampleParse() {
	tags := tagging.Parse("SELECT * FROM orders /*app='billing',note='it\\'s%20late',tenant='42'*/;")
	for k, v := range tags.All() {
		fmt.Printf("%s=%q\n", k, v)
	}
	fmt.Println(tagging.Parse("SELECT 1").Len())
	// Output:
	// app="billing"
	// note="it's late"
	// tenant="42"
	// 0
}

func ExampleMiddleware() {
	mux := http.NewServeMux()
	// Registered inside the mux, so that route is the pattern, not the URL.
	mux.Handle("GET /orders/{id}", tagging.Middleware(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			// Pass r.Context() to database/sql: its queries carry these tags.
			for k, v := range tagging.From(r.Context()).All() {
				fmt.Printf("%s=%s\n", k, v)
			}
		})))

	r := httptest.NewRequest("GET", "/orders/42", nil)
	r.RemoteAddr = "203.0.113.5:52100"
	mux.ServeHTTP(httptest.NewRecorder(), r)
	// Output:
	// method=GET
	// remote_address=203.0.113.5
	// route=/orders/{id}
}
