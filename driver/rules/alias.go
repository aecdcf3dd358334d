package rules

import (
	"fmt"

	"go.yaml.in/yaml/v3"
)

// The values that a file's aliases stand for, counted as nodes with the aliases inside them
// expanded, may number at most aliasFactor times the file's own nodes, and at least
// minAliasBound: room for any use of an alias to avoid repeating a match or a throttle_when,
// and still time and memory in proportion to the file.
const (
	aliasFactor   = 10
	minAliasBound = 10_000
)

// checkAliases refuses a YAML tree whose aliases expand it past the bound above, naming the
// line of the alias that crosses it (never the anchor's name, which may be anything: see
// [syntaxError]).
//
// The decoder follows an alias wherever it meets one, as if its value were written there, and
// the YAML library's own bound on aliases applies only to its typed decoding, not to the node
// tree decoded here. Without this check a small file expands without limit: 2,000 rules whose
// match is an alias of one 2,000-pair match decode 4 million pairs, and aliases of aliases
// double at each level. A value holding an alias of itself stands for an endless value and is
// refused the same way.
func checkAliases(root *yaml.Node) *Error {
	own, aliases := countNodes(root)
	if !aliases {
		return nil
	}
	x := expansion{bound: max(minAliasBound, aliasFactor*own), sizes: map[*yaml.Node]int{}}
	if at := x.cross(root); at != nil {
		return &Error{Line: max(at.Line, 1), Msg: fmt.Sprintf("aliases expand the file too much: up to this one "+
			"they stand for more than %d values, the bound for a file of %d (%d times as many, and at least %d)",
			x.bound, own, aliasFactor, minAliasBound)}
	}
	return nil
}

// countNodes returns the number of nodes of the tree at n, without following aliases, and
// whether any is an alias.
func countNodes(n *yaml.Node) (count int, aliases bool) {
	count, aliases = 1, n.Kind == yaml.AliasNode
	for _, c := range n.Content {
		k, a := countNodes(c)
		count, aliases = count+k, aliases || a
	}
	return count, aliases
}

// expansion counts the nodes that aliases stand for.
type expansion struct {
	bound int
	used  int                // nodes the aliases met so far stand for
	sizes map[*yaml.Node]int // expanded size of each anchored node counted; -1 while it is counted
}

// cross walks the tree at n in file order, adding what each alias stands for, and returns the
// alias whose value takes the count past the bound, or nil.
func (x *expansion) cross(n *yaml.Node) *yaml.Node {
	if n.Kind == yaml.AliasNode {
		if x.used += x.size(n); x.used > x.bound {
			return n
		}
		return nil
	}
	for _, c := range n.Content {
		if at := x.cross(c); at != nil {
			return at
		}
	}
	return nil
}

// size returns the number of nodes n stands for with its aliases expanded, at most bound+1.
// Each anchored node (an alias's target) is counted once, so that the walk takes time in
// proportion to the file however the aliases nest.
func (x *expansion) size(n *yaml.Node) int {
	if n.Kind == yaml.AliasNode {
		if n = follow(n); n == nil {
			return 1 // a chain too long, which the decoder reports
		}
	}
	if n.Anchor != "" {
		switch s, ok := x.sizes[n]; {
		case ok && s < 0:
			return x.bound + 1 // an alias within the value it names: endless
		case ok:
			return s
		}
		x.sizes[n] = -1
	}
	s := 1
	for _, c := range n.Content {
		s = min(s+x.size(c), x.bound+1)
	}
	if n.Anchor != "" {
		x.sizes[n] = s
	}
	return s
}
