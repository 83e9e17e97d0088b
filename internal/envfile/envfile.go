// SPDX-License-Identifier: MIT

// Package envfile reads files of VAR=VALUE lines the way systemd's
// EnvironmentFile= reads them (systemd.exec(5)), so that a command can be
// checked with exactly the settings its service will get: /etc/default/*
// and /etc/sysconfig/* files.
package envfile

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"
)

// Read returns the variables of the file at path, later lines winning.
func Read(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read environment file: %w", err)
	}
	defer f.Close()
	vars, err := Parse(f)
	if err != nil {
		return nil, fmt.Errorf("environment file %s: %w", path, err)
	}
	return vars, nil
}

// Parse reads VAR=VALUE lines: blank lines and lines starting with # or ;
// are skipped, space around VAR and before VALUE is dropped, a VALUE in
// double or single quotes loses them (a backslash in double quotes escapes
// the next character), and a line ending in a backslash continues on the
// next. A line without "=" or with a VAR that is not a name is an error,
// where systemd would ignore it with a warning in its log, which an admin
// rarely reads.
func Parse(r io.Reader) (map[string]string, error) {
	vars := map[string]string{}
	sc := bufio.NewScanner(r)
	n := 0
	var cont string
	for sc.Scan() {
		n++
		line := cont + sc.Text()
		cont = ""
		if strings.HasSuffix(line, `\`) && !strings.HasSuffix(line, `\\`) {
			cont = strings.TrimSuffix(line, `\`)
			continue
		}
		t := strings.TrimSpace(line)
		if t == "" || t[0] == '#' || t[0] == ';' {
			continue
		}
		k, v, ok := strings.Cut(t, "=")
		k = strings.TrimSpace(k)
		if !ok || !isName(k) {
			return nil, fmt.Errorf("line %d: want VAR=VALUE, got %q", n, truncate(t))
		}
		v, err := unquote(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("line %d: %s: %w", n, k, err)
		}
		vars[k] = v
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return vars, nil
}

func isName(s string) bool {
	for i, c := range s {
		if c != '_' && (c < 'A' || c > 'Z') && (c < 'a' || c > 'z') && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return s != ""
}

func unquote(v string) (string, error) {
	if len(v) == 0 || (v[0] != '"' && v[0] != '\'') {
		return v, nil
	}
	q := v[0]
	if len(v) < 2 || v[len(v)-1] != q {
		return "", fmt.Errorf("unterminated %c quote", q)
	}
	v = v[1 : len(v)-1]
	if q == '\'' {
		return v, nil
	}
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] == '\\' && i+1 < len(v) {
			i++
		}
		b.WriteByte(v[i])
	}
	return b.String(), nil
}

func truncate(s string) string {
	if len(s) > 60 {
		return s[:60] + "…"
	}
	return s
}
