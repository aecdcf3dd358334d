// Package bounded holds the bounds of untrusted tag text (from sqlcommenter comments, request
// paths, and whatever else a client can choose) and the functions that apply them, so that the
// tag parser, the HTTP middleware and the span attributes agree; and the bound of a statement's
// normalised text (a client chooses its size too), which package pattern applies once.
//
// It imports only the standard library.
package bounded
