package config

import (
	"errors"
	"fmt"
	"sort"
)

// Validate reports every problem of c at once, each naming the key, the value
// and what is allowed.
func (c Config) Validate() error { return c.validate(nil) }

// validate is Validate, skipping the checks of the keys in skip (those that
// did not decode): the rules of each key (keys), then the checks across
// keys (crossChecks).
func (c Config) validate(skip map[string]bool) error {
	r := &report{skip: skip}
	for _, k := range keys {
		k.bind.check(c, k, func(val any, allowed string) { r.bad(k.name, val, allowed) })
	}
	for _, check := range crossChecks {
		check(c, r)
	}
	sort.Slice(r.problems, func(i, j int) bool { return r.problems[i].Error() < r.problems[j].Error() })
	return errors.Join(r.problems...)
}

// report gathers the problems validate finds.
type report struct {
	skip     map[string]bool
	problems []error
}

// bad reports key's value val and what is allowed, unless key is skipped.
func (r *report) bad(key string, val any, allowed string) {
	if r.skip[key] {
		return
	}
	r.problems = append(r.problems, fmt.Errorf("config: %s = %q: %s", key, fmt.Sprint(val), allowed))
}

// add reports a problem of several keys.
func (r *report) add(err error) { r.problems = append(r.problems, err) }

// crossChecks are the checks of keys against each other, after each key's
// own rules.
var crossChecks = []func(c Config, r *report){
	saslCredentials,
	pair("ssl.cert.file", "ssl.key.file", func(c Config) (string, string) { return c.Security.CertFile, c.Security.KeyFile }),
	pair("http.tls.cert.file", "http.tls.key.file", func(c Config) (string, string) { return c.HTTP.CertFile, c.HTTP.KeyFile }),
	pair("http.tls.peer.cert.file", "http.tls.peer.key.file", func(c Config) (string, string) { return c.HTTP.PeerCertFile, c.HTTP.PeerKeyFile }),
	distinctTopics,
	transactionTimeout,
}

// saslCredentials: SASL needs a user and a password.
func saslCredentials(c Config, r *report) {
	sec := c.Security
	if !sec.SASL() {
		return
	}
	if sec.SASLUsername == "" {
		r.bad("sasl.username", "", "required with security.protocol "+sec.Protocol)
	}
	if sec.SASLPassword == "" && sec.SASLPasswordFile == "" {
		r.add(fmt.Errorf("config: sasl.password or sasl.password.file is required with security.protocol %s", sec.Protocol))
	}
}

// pair is the check that a certificate and its key are given together.
func pair(certKey, keyKey string, files func(Config) (cert, key string)) func(Config, *report) {
	return func(c Config, r *report) {
		if cert, key := files(c); (cert == "") != (key == "") {
			r.add(fmt.Errorf("config: %s and %s go together (got cert %q, key %q)", certKey, keyKey, cert, key))
		}
	}
}

// distinctTopics: notifications do not go to the input.
func distinctTopics(c Config, r *report) {
	if c.InputTopic != "" && c.InputTopic == c.NotificationTopic {
		r.bad("notification.topic", c.NotificationTopic, "must differ from input.topic")
	}
}

// transactionTimeout: a transaction outlives its commit cycle, and the
// broker accepts its timeout. Skipped when commit.interval.ms is not a
// positive interval (its own rule reports it).
func transactionTimeout(c Config, r *report) {
	switch {
	case c.CommitInterval <= 0:
	case c.TransactionTimeoutSet > 0 && c.TransactionTimeoutSet < 2*c.CommitInterval:
		r.bad("transaction.timeout.ms", c.TransactionTimeoutSet.Milliseconds(), fmt.Sprintf(
			"must be at least twice commit.interval.ms (%d), or a transaction would be aborted before its cycle ends", c.CommitInterval.Milliseconds()))
	case c.ProcessingGuarantee == ExactlyOnceV2 && c.TransactionTimeoutSet == 0 && c.TransactionTimeout() > MaxTransactionTimeout:
		r.bad("commit.interval.ms", c.CommitInterval.Milliseconds(), fmt.Sprintf(
			"at most %d with processing.guarantee %s (the transaction timeout, 10 × commit.interval.ms, must stay within the broker's transaction.max.timeout.ms of %s)",
			(MaxTransactionTimeout/10).Milliseconds(), ExactlyOnceV2, fmt.Sprintf("%g min", MaxTransactionTimeout.Minutes())))
	}
}
