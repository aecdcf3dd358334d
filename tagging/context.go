package tagging

import "context"

// ctxKey is the context key for Tags; a zero-size type so that lookups
// neither allocate nor collide with other packages' keys.
type ctxKey struct{}

// With returns a copy of ctx carrying the given key, value, key, value...
// tags merged onto those ctx already carries; for a key present in both,
// the new value wins, and within kv a later value wins.
// Pairs with an empty key are dropped.
//
// An odd number of arguments is a programming error, as for a mismatched
// format string, and With panics with a message saying so.
func With(ctx context.Context, kv ...string) context.Context {
	if len(kv) == 0 {
		return ctx
	}
	t, added := From(ctx).with("With", kv)
	if !added {
		return ctx // every key was empty
	}
	return context.WithValue(ctx, ctxKey{}, t)
}

// From returns the tags carried by ctx, or empty Tags when it carries none.
// It does not allocate.
func From(ctx context.Context) Tags {
	t, _ := ctx.Value(ctxKey{}).(Tags)
	return t
}
