// Package vocab defines the words and defaults of a rules file that pgtraffic's layers share:
// the reasons a statement is refused or warned about, the built-in tag keys and statement kinds
// a rule's match may name (and how the value of one, a fingerprint, is spelled), the health
// metrics a budget's throttle_when may name, and the defaults that both the rules config and an
// internal core apply.
//
// It imports only the standard library's strconv and time, so that every layer may import it.
//
// # Why a package of its own
//
// Each value here is needed by a public package and by a core below the engine: the budget
// core refuses with the reasons and sizes a bucket by the default burst window, the health
// sampler reads the metrics the rules name. The cores must not import the rules config, which
// needs a YAML library, and the rules config must not import anything under internal/; so
// neither can hold the definition for the other, and an internal leaf could not be imported by
// the public config. This leaf is public, beside the config whose words it holds, and is their
// one definition: driver's Reason constants and the rules package's Metric constants and
// defaults, the names users write in code, are declared as these, and everything else refers
// to these directly.
package vocab
