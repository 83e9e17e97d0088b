// SPDX-License-Identifier: MIT

package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/airlock-vpn/airlock/internal/client"
	"github.com/airlock-vpn/airlock/internal/preflight"
)

// airlock run's settings come from, first found wins: its command line,
// its environment (AIRLOCK_NAME, applyEnv), the site file
// (internal/client/sitefile.go says what it is and which files it
// refuses), the flag's default. siteGroups are the settings a job sets
// together: one of a group set by the job keeps the site file's values
// for the whole group away.
var siteGroups = [][]string{{"gateway", "pin"}, {"token", "token-file"}}

// siteFileFlag is the flag naming the site file; the file cannot set it.
const siteFileFlag = "site-file"

// otherSiteNames are the names a site file shared with the HTCondor
// wrapper may hold that are its own, not airlock run's.
var otherSiteNames = []string{"AIRLOCK_BIN", "AIRLOCK_ENV_FILE"}

// secretFlags are the settings whose value --check does not print.
var secretFlags = []string{"token"}

// setting is where one of airlock run's settings came from.
type setting struct {
	Flag   string // gateway
	Value  string // as set; "" if unset
	Source string // "command line", "environment AIRLOCK_GATEWAY", "site file PATH:LINE", "default"
}

// applySiteFile sets every flag of cmd that neither the command line nor
// the environment set from the site file, and returns where each setting
// came from. Names in the file that are no setting of cmd are reported on
// warn and ignored (the same file may serve the HTCondor wrapper).
func applySiteFile(cmd *cobra.Command, path string, getenv func(string) string, warn io.Writer) ([]setting, error) {
	fs := cmd.Flags()
	required := fs.Changed(siteFileFlag) || getenv(client.EnvSiteFile) != ""
	site, err := client.LoadSiteFile(path, required)
	switch {
	case err != nil && !required && errors.Is(err, os.ErrPermission):
		// The default file, made readable by root only (it may be the
		// SPANK plugin's env= file): not this user's to read.
		fmt.Fprintf(warn, "airlock: warning: %v; the site's defaults are not used\n", err)
	case err != nil:
		return nil, err
	}
	source := jobSettings(fs, getenv) // flag → source, for flags the job set
	skip := siteSkips(source)
	var out []setting
	for _, sv := range site.Values {
		f := flagOfEnv(fs, sv.Name)
		if slices.Contains(otherSiteNames, sv.Name) {
			continue
		}
		if f == nil || f.Name == siteFileFlag {
			fmt.Fprintf(warn, "airlock: warning: site file %s:%d: %s is no setting of airlock run; ignored\n", site.Path, sv.Line, sv.Name)
			continue
		}
		if _, set := source[f.Name]; set {
			continue
		}
		if by, ok := skip[f.Name]; ok {
			source[f.Name] = fmt.Sprintf("default: the job set --%s, so the site file's %s (%s:%d) is not used", by, sv.Name, site.Path, sv.Line)
			continue
		}
		if err := f.Value.Set(sv.Value); err != nil {
			return nil, usagef("site file %s:%d: bad %s=%q (for --%s): %w", site.Path, sv.Line, sv.Name, truncateArg(sv.Value), f.Name, err)
		}
		source[f.Name] = fmt.Sprintf("site file %s:%d", site.Path, sv.Line)
	}
	if _, set := source[siteFileFlag]; !set {
		source[siteFileFlag] = "default"
		if site.Path == "" {
			source[siteFileFlag] = "default; absent, not read"
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		s := setting{Flag: f.Name, Value: f.Value.String(), Source: source[f.Name]}
		if s.Source == "" {
			s.Source = "default"
		}
		out = append(out, s)
	})
	return out, nil
}

// jobSettings returns where the job set each flag of fs it set: "command
// line" or "environment VAR".
func jobSettings(fs *pflag.FlagSet, getenv func(string) string) map[string]string {
	source := map[string]string{}
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed {
			source[f.Name] = "command line"
			return
		}
		for _, v := range f.Annotations[envAnnotation] {
			if getenv(v) != "" {
				source[f.Name] = "environment " + v
				return
			}
		}
	})
	return source
}

// siteSkips returns, for each flag of a group of siteGroups one of whose
// flags the job set (set: flag → source), the flag the job set: the site
// file's values of that group are not used.
func siteSkips(set map[string]string) map[string]string {
	skip := map[string]string{}
	for _, g := range siteGroups {
		for _, name := range g {
			if _, ok := set[name]; ok {
				for _, other := range g {
					skip[other] = name
				}
				break
			}
		}
	}
	return skip
}

// flagOfEnv is the flag of fs read from the environment variable name.
func flagOfEnv(fs *pflag.FlagSet, name string) *pflag.Flag {
	var found *pflag.Flag
	fs.VisitAll(func(f *pflag.Flag) {
		if found == nil && slices.Contains(f.Annotations[envAnnotation], name) {
			found = f
		}
	})
	return found
}

// sourceOf returns the source of flag in settings.
func sourceOf(settings []setting, flag string) string {
	for _, s := range settings {
		if s.Flag == flag {
			return s.Source
		}
	}
	return ""
}

// settingsReport is airlock run --check's first lines: where each setting
// that is not its default came from, and the join settings even when
// unset. Secrets are not printed.
func settingsReport(settings []setting) preflight.Report {
	var rep preflight.Report
	join := []string{"gateway", "pin", "token", "token-file"}
	for _, s := range settings {
		if s.Flag == "check" || s.Flag == "json" || s.Source == "default" && !slices.Contains(join, s.Flag) && s.Flag != siteFileFlag {
			continue
		}
		v := s.Value
		switch {
		case v == "" || strings.HasPrefix(s.Source, "default:"):
			v = "(unset)"
		case slices.Contains(secretFlags, s.Flag):
			v = fmt.Sprintf("(set, %d characters)", len(v))
		}
		rep = append(rep, preflight.Result{Name: "--" + s.Flag, Status: preflight.OK, Detail: v + " from " + s.Source})
	}
	return rep
}
