// SPDX-License-Identifier: MIT

// Package config reads the gateway's config file (`airlock gateway
// --config FILE`): a versioned TOML document with the site's egress policy,
// the jobs' traffic limits and who may expose ports. Load reads and
// validates it completely, so that the gateway can refuse a bad file
// before it opens any socket and keep its old config when a reload is bad.
// Every problem is reported as an [*Error] naming file, line and key.
// Unknown keys are errors: a typo never silently loosens the policy.
//
// The format is documented in docs/config.md; docs/gateway.example.toml is
// a complete, annotated example that the tests load.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/netip"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/airlock-vpn/airlock/internal/jointoken"
	"github.com/airlock-vpn/airlock/internal/limits"
	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// Version is the only config format version this gateway reads.
const Version = 1

// maxSize bounds the config file.
const maxSize = 4 << 20

// Config is a validated config: what the gateway enforces. Treat it as
// immutable.
type Config struct {
	// Path is the file it was loaded from ("" for a config made from
	// flags).
	Path string
	// Policy decides jobs' outgoing flows.
	Policy *policy.Policy
	// Exposure decides which ports jobs may expose; nil allows every
	// exposure (no config file).
	Exposure *policy.Exposure
	// Limits are the traffic limits.
	Limits Limits
	// Quotas bound each token's leases and joins (quota.go).
	Quotas Quotas
	// Bypass is the site-local bypass (bypass.go).
	Bypass Bypass
	// Capture are the standing capture feeds (capture.go).
	Capture []Capture
	// Attest is attested identity (attest.go).
	Attest Attest
	// PolicyTests are the [[policy.test]] entries, all passed
	// (policytest.go).
	PolicyTests []PolicyTest
	// Bearer is identity from bearer tokens (bearer.go).
	Bearer Bearer

	// lines are the lines of the file's keys, for Warnings.
	lines lineIndex
}

// Limits are the traffic limits of a config.
type Limits struct {
	// EgressBitsPerSec and IngressBitsPerSec cap all jobs together (0:
	// unlimited).
	EgressBitsPerSec, IngressBitsPerSec uint64
	// Job are the limits of jobs whose token has no entry in Tokens.
	Job limits.Job
	// Tokens are the complete limits of the jobs of each token name.
	Tokens map[string]limits.Job
}

// ForToken returns the limits of a job that joined with the token named
// tok.
func (l Limits) ForToken(tok string) limits.Job {
	if t, ok := l.Tokens[tok]; ok {
		return t
	}
	return l.Job
}

// IsZero reports whether l limits nothing.
func (l Limits) IsZero() bool {
	if l.EgressBitsPerSec != 0 || l.IngressBitsPerSec != 0 || !l.Job.IsZero() {
		return false
	}
	for _, t := range l.Tokens {
		if !t.IsZero() {
			return false
		}
	}
	return true
}

// Default returns the config of a gateway without a config file: allow
// what the built-in protections allow, no limits, every exposure allowed.
func Default() *Config {
	return &Config{Policy: &policy.Policy{Default: policy.Allow}, Quotas: DefaultQuotas()}
}

// Load reads and validates the config file at path. A missing file gives
// an error wrapping ErrAbsent; every other problem an *Error (or several,
// joined) with the file, line and key.
func Load(path string) (*Config, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// readFile reads the config file at path, at most maxSize bytes.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s: %w", path, ErrAbsent)
		}
		return nil, fmt.Errorf("read config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSize+1))
	if err != nil {
		return nil, fmt.Errorf("read config %s: %w", path, err)
	}
	if len(data) > maxSize {
		return nil, &Error{File: path, Err: fmt.Errorf("larger than %d bytes", maxSize)}
	}
	return data, nil
}

// Parse decodes and validates a config document; name is used in errors.
func Parse(name string, data []byte) (*Config, error) { return parse(name, data, true) }

// LoadUntested is Load without running the [[policy.test]] entries, for
// `airlock policy explain`, which shows why a failing test fails. The
// gateway never uses it.
func LoadUntested(path string) (*Config, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	return parse(path, data, false)
}

// RuleLine returns the line of the i-th (0-based) [[policy.rule]] in the
// file, 0 if unknown.
func (c *Config) RuleLine(i int) int { return c.lines.find(fmt.Sprintf("policy.rule[%d]", i+1)) }

func parse(name string, data []byte, runTests bool) (*Config, error) {
	var doc file
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return nil, decodeError(name, err)
	}
	lines := keyLines(data)
	cfg, errs := doc.validate(runTests)
	if len(errs) > 0 {
		out := make([]error, 0, len(errs))
		for _, ke := range errs {
			out = append(out, &Error{File: name, Line: lines.find(ke.key), Key: ke.key, Err: ke.err})
		}
		if len(out) == 1 {
			return nil, out[0]
		}
		return nil, errors.Join(out...)
	}
	cfg.Path, cfg.lines = name, lines
	return cfg, nil
}

// decodeError converts go-toml's errors to *Error.
func decodeError(name string, err error) error {
	var sm *toml.StrictMissingError
	if errors.As(err, &sm) {
		var out []error
		for i := range sm.Errors {
			de := &sm.Errors[i]
			row, _ := de.Position()
			k := strings.Join(de.Key(), ".")
			out = append(out, &Error{File: name, Line: row, Key: k, Err: fmt.Errorf("unknown key (misspelt, or not in config version %d; see docs/config.md)", Version)})
		}
		if len(out) == 1 {
			return out[0]
		}
		return errors.Join(out...)
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		row, _ := de.Position()
		msg := typeMessage(strings.TrimPrefix(de.Error(), "toml: "))
		return &Error{File: name, Line: row, Key: strings.Join(de.Key(), "."), Err: errors.New(msg)}
	}
	return &Error{File: name, Err: err}
}

// file is the document as written.
type file struct {
	Version *int64        `toml:"version"`
	Policy  filePolicy    `toml:"policy"`
	Limits  fileLimits    `toml:"limits"`
	Expose  []fileExpose  `toml:"expose"`
	Quota   fileQuotas    `toml:"quota"`
	Bypass  []fileBypass  `toml:"bypass"`
	DNS     fileDNS       `toml:"dns"`
	Capture []fileCapture `toml:"capture"`
	Attest  *fileAttest   `toml:"attest"`
	Issuer  []fileIssuer  `toml:"issuer"`
	Bearer  *fileBearer   `toml:"bearer"`
}

type filePolicy struct {
	Default string           `toml:"default"`
	Rule    []fileRule       `toml:"rule"`
	Test    []filePolicyTest `toml:"test"`
}

type fileRule struct {
	Name   string   `toml:"name"`
	Action string   `toml:"action"`
	To     []string `toml:"to"`
	Proto  string   `toml:"proto"`
	Ports  []any    `toml:"ports"`
	Tokens []string `toml:"tokens"`
}

type fileLimits struct {
	EgressRate  string                   `toml:"egress_rate"`
	IngressRate string                   `toml:"ingress_rate"`
	Job         fileJobLimits            `toml:"job"`
	Token       map[string]fileJobLimits `toml:"token"`
}

type fileJobLimits struct {
	EgressRate     *string `toml:"egress_rate"`
	IngressRate    *string `toml:"ingress_rate"`
	MaxFlows       *int64  `toml:"max_flows"`
	NewFlowsPerSec *any    `toml:"new_flows_per_sec"`
	// DNS limits; 0 or absent: the relay's defaults.
	DNSMaxInflight   *int64 `toml:"dns_max_inflight"`
	DNSQueriesPerSec *any   `toml:"dns_queries_per_sec"`
}

type fileExpose struct {
	Tokens []string `toml:"tokens"`
	Proto  string   `toml:"proto"`
	Ports  []any    `toml:"ports"`
}

// keyErr is a validation problem at a key path.
type keyErr struct {
	key string
	err error
}

// validate turns the document into a Config, collecting every problem.
func (d *file) validate(runTests bool) (*Config, []keyErr) {
	var errs []keyErr
	bad := func(key string, format string, args ...any) {
		errs = append(errs, keyErr{key, fmt.Errorf(format, args...)})
	}
	switch {
	case d.Version == nil:
		bad("version", "missing: the file must start with version = %d", Version)
	case *d.Version != Version:
		bad("version", "%d: this gateway reads config version %d", *d.Version, Version)
	}
	cfg := &Config{Policy: &policy.Policy{}, Exposure: &policy.Exposure{}}

	switch d.Policy.Default {
	case "", "allow":
		cfg.Policy.Default = policy.Allow
	case "deny":
		cfg.Policy.Default = policy.Deny
	default:
		bad("policy.default", "%q: want allow or deny", d.Policy.Default)
	}
	names := map[string]int{}
	for i, fr := range d.Policy.Rule {
		key := fmt.Sprintf("policy.rule[%d]", i+1)
		r := policy.Rule{Name: fr.Name}
		if r.Name == "" {
			r.Name = fmt.Sprintf("rule%d", i+1)
		} else if err := policy.ValidateName(r.Name); err != nil {
			bad(key+".name", "%v", err)
		}
		if j, ok := names[r.Name]; ok {
			bad(key+".name", "%q is also the name of policy.rule[%d]; names must be unique (they label drop counters)", r.Name, j)
		}
		names[r.Name] = i + 1
		if fr.Action == "" {
			bad(key, "no action: want action = \"allow\" or \"deny\"")
		} else if a, err := policy.ParseAction(fr.Action); err != nil {
			bad(key+".action", "%v", err)
		} else {
			r.Action = a
		}
		if fr.To != nil && len(fr.To) == 0 {
			bad(key+".to", "empty list: omit to for every destination, or list prefixes")
		}
		for _, s := range fr.To {
			p, err := parsePrefix(s)
			if err != nil {
				bad(key+".to", "%v", err)
				continue
			}
			r.To = append(r.To, p)
		}
		parseMatch(&r, fr.Proto, fr.Ports, fr.Tokens, key, bad)
		cfg.Policy.Rules = append(cfg.Policy.Rules, r)
	}

	l := &cfg.Limits
	l.EgressBitsPerSec = parseRate(d.Limits.EgressRate, "limits.egress_rate", bad)
	l.IngressBitsPerSec = parseRate(d.Limits.IngressRate, "limits.ingress_rate", bad)
	l.Job = d.Limits.Job.resolve(limits.Job{}, "limits.job", bad)
	if len(d.Limits.Token) > 0 {
		l.Tokens = make(map[string]limits.Job, len(d.Limits.Token))
		toks := make([]string, 0, len(d.Limits.Token))
		for t := range d.Limits.Token {
			toks = append(toks, t)
		}
		sort.Strings(toks)
		for _, t := range toks {
			key := "limits.token." + quoteKey(t)
			if err := jointoken.ValidateName(t); err != nil {
				bad(key, "%v", err)
				continue
			}
			l.Tokens[t] = d.Limits.Token[t].resolve(l.Job, key, bad)
		}
	}

	cfg.Quotas = d.Quota.resolve(bad)

	for i, fe := range d.Expose {
		key := fmt.Sprintf("expose[%d]", i+1)
		var r policy.ExposeRule
		p, err := policy.ParseProto(fe.Proto)
		if err != nil || p == policy.ProtoICMP {
			bad(key+".proto", "%q: want tcp, udp or any", fe.Proto)
		}
		r.Proto = p
		r.Ports = parsePorts(fe.Ports, key+".ports", bad)
		r.Tokens = parseTokens(fe.Tokens, key+".tokens", bad)
		cfg.Exposure.Rules = append(cfg.Exposure.Rules, r)
	}
	d.validateBypass(cfg, bad)
	cfg.Capture = validateCapture(d.Capture, cfg.Policy, bad)
	cfg.Attest = d.resolveAttest(bad)
	cfg.PolicyTests = parsePolicyTests(d.Policy.Test, bad)
	cfg.Bearer = d.resolveBearer(bad)
	if len(errs) == 0 {
		if err := cfg.Policy.Validate(); err != nil {
			bad("policy", "%v", err)
		}
	}
	if len(errs) == 0 && runTests {
		runPolicyTests(cfg.Policy, cfg.PolicyTests, bad)
	}
	return cfg, errs
}

// resolve applies the set fields of j on top of base.
func (j fileJobLimits) resolve(base limits.Job, key string, bad func(string, string, ...any)) limits.Job {
	out := base
	if j.EgressRate != nil {
		out.EgressBitsPerSec = parseRate(*j.EgressRate, key+".egress_rate", bad)
	}
	if j.IngressRate != nil {
		out.IngressBitsPerSec = parseRate(*j.IngressRate, key+".ingress_rate", bad)
	}
	if j.MaxFlows != nil {
		if *j.MaxFlows < 0 || *j.MaxFlows > math.MaxInt32 {
			bad(key+".max_flows", "%d: want 0 (unlimited) to %d", *j.MaxFlows, math.MaxInt32)
		} else {
			out.MaxFlows = int(*j.MaxFlows)
		}
	}
	if j.NewFlowsPerSec != nil {
		var v float64
		switch x := (*j.NewFlowsPerSec).(type) {
		case int64:
			v = float64(x)
		case float64:
			v = x
		default:
			bad(key+".new_flows_per_sec", "%v: want a number", x)
		}
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) || v > 1e6 {
			bad(key+".new_flows_per_sec", "%v: want 0 (unlimited) or a positive number up to 1000000", v)
		} else {
			out.NewFlowsPerSec = v
		}
	}
	j.resolveDNS(&out, key, bad)
	return out
}

func parseRate(s, key string, bad func(string, string, ...any)) uint64 {
	if s == "unlimited" {
		return 0
	}
	v, err := limits.ParseRate(s)
	if err != nil {
		bad(key, "%v (or \"unlimited\")", err)
	}
	return v
}

// parsePrefix reads "10.0.0.0/8", "192.0.2.7" (one address) or "::/0".
func parsePrefix(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("%q: want an address or prefix such as 10.0.0.0/8", s)
		}
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q: want a prefix such as 10.0.0.0/8", s)
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("%q: write IPv4 prefixes in dotted form", s)
	}
	if p != p.Masked() {
		return netip.Prefix{}, fmt.Errorf("%q has host bits set: did you mean %s?", s, p.Masked())
	}
	return p, nil
}

// parseMatch parses the protocol, ports and tokens that policy rules and
// bypass entries share into r, under key.
func parseMatch(r *policy.Rule, proto string, ports []any, tokens []string, key string, bad func(string, string, ...any)) {
	p, err := policy.ParseProto(proto)
	if err != nil {
		bad(key+".proto", "%v", err)
	}
	r.Proto = p
	r.Ports = parsePorts(ports, key+".ports", bad)
	if len(r.Ports) > 0 && r.Proto == policy.ProtoICMP {
		bad(key+".ports", "ports with proto = \"icmp\": ICMP has no ports")
	}
	r.Tokens = parseTokens(tokens, key+".tokens", bad)
}

// parsePorts reads a list of ports: numbers, "N" or "LO-HI".
func parsePorts(in []any, key string, bad func(string, string, ...any)) []portblock.Range {
	if in != nil && len(in) == 0 {
		bad(key, "empty list: omit ports for every port, or list ports and LO-HI ranges")
	}
	var out []portblock.Range
	for _, x := range in {
		var r portblock.Range
		var err error
		switch v := x.(type) {
		case int64:
			if v < 1 || v > 65535 {
				err = fmt.Errorf("port %d: want 1-65535", v)
			}
			r = portblock.Range{Lo: uint16(v), Hi: uint16(v)}
		case string:
			r, err = parsePortRange(v)
		default:
			err = fmt.Errorf("%v: want a port number or a \"LO-HI\" string", v)
		}
		if err != nil {
			bad(key, "%v", err)
			continue
		}
		out = append(out, r)
	}
	return out
}

func parsePortRange(s string) (portblock.Range, error) {
	lo, hi, isRange := strings.Cut(strings.TrimSpace(s), "-")
	if !isRange {
		hi = lo
	}
	l, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
	h, err2 := strconv.ParseUint(strings.TrimSpace(hi), 10, 16)
	if err1 != nil || err2 != nil || l == 0 || l > h {
		return portblock.Range{}, fmt.Errorf("port range %q: want N or LO-HI with 1 <= LO <= HI <= 65535", s)
	}
	return portblock.Range{Lo: uint16(l), Hi: uint16(h)}, nil
}

func parseTokens(in []string, key string, bad func(string, string, ...any)) []string {
	if in != nil && len(in) == 0 {
		bad(key, "empty list: omit tokens for every token, or list token names")
	}
	for _, t := range in {
		if err := jointoken.ValidateName(t); err != nil {
			bad(key, "%v", err)
		}
	}
	return in
}

// quoteKey quotes a TOML key part if it is not a bare key.
func quoteKey(k string) string {
	for _, c := range k {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return strconv.Quote(k)
		}
	}
	return k
}

// typeRE matches go-toml's type mismatch message.
var typeRE = regexp.MustCompile(`^cannot decode TOML (\w+) into .* of type (\S+)$`)

// typeMessage rewrites a type mismatch in TOML terms, without Go type
// names.
func typeMessage(msg string) string {
	m := typeRE.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	want := "a table"
	switch t := strings.TrimLeft(m[2], "*"); {
	case strings.HasPrefix(t, "[]"):
		want = "a list"
	case t == "string":
		want = "a string"
	case strings.HasPrefix(t, "int"), strings.HasPrefix(t, "float"), t == "interface {}":
		want = "a number"
	}
	return fmt.Sprintf("wrong type: got a TOML %s, want %s", m[1], want)
}
