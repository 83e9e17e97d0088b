// SPDX-License-Identifier: MIT

package main

// The command line's shared parts. Every command is a *cobra.Command made
// by a newXxxCmd(stdout, stderr) function and added in newRoot; cobra gives
// help on stdout, `airlock help CMD`, "did you mean" for a mistyped
// command, shell completion and, from the same definitions, the man pages
// and docs/cli/ (gendocs_test.go). What cobra leaves to us is here: exit
// codes, flags read from the environment, the state directory flag, --json,
// and the single-dash spelling of long flags that Go's flag package
// accepted (-state) and that older scripts may still use.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Exit statuses of every command but run, which returns its job's status
// (and client.ExitFailure, 125, for its own failures, bad flags included).
// The root command's help lists them.
const (
	exitFailure = 1 // the command failed, a --check found a problem, whois found no lease
	exitUsage   = 2 // bad command line: unknown command or flag, wrong arguments
)

// exitError ends airlock with a status and no message of its own (the
// command has printed what it had to say).
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// usageError is a bad command line. airlock prints it with a pointer to
// the command's help and exits exitUsage (run: 125).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usagef returns a usageError.
func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// defaultStateDir is the gateway's state directory when neither --state
// nor AIRLOCK_STATE says otherwise: the packages' systemd unit uses it.
const defaultStateDir = "/var/lib/airlock"

// envAnnotation names, on a flag, the environment variables it is read
// from when the command line does not set it, first one set wins.
const envAnnotation = "airlock_env"

// envName is the environment variable of flag name under prefix:
// AIRLOCK + token-file is AIRLOCK_TOKEN_FILE.
func envName(prefix, name string) string {
	return prefix + "_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// setEnv makes f read vars and says so in its help.
func setEnv(f *pflag.Flag, vars ...string) {
	if f.Annotations == nil {
		f.Annotations = map[string][]string{}
	}
	f.Annotations[envAnnotation] = vars
	f.Usage += " (env " + strings.Join(vars, ", ") + ")"
}

// envPrefix makes every flag of cmd that names no variable yet read
// PREFIX_NAME (AIRLOCK_TOKEN_FILE for run's --token-file).
func envPrefix(cmd *cobra.Command, prefix string) {
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if _, ok := f.Annotations[envAnnotation]; !ok {
			setEnv(f, envName(prefix, f.Name))
		}
	})
}

// applyEnv sets every flag of cmd that the command line left alone from
// the first of its variables that is set and not empty.
func applyEnv(cmd *cobra.Command, getenv func(string) string) error {
	var err error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed {
			return
		}
		for _, v := range f.Annotations[envAnnotation] {
			if val := getenv(v); val != "" {
				if e := f.Value.Set(val); e != nil {
					err = usagef("bad %s=%q (for --%s): %w", v, truncateArg(val), f.Name, e)
				}
				if f.Deprecated != "" {
					fmt.Fprintf(cmd.ErrOrStderr(), "%s sets --%s, which has been deprecated: %s\n", v, f.Name, f.Deprecated)
				}
				return
			}
		}
	})
	return err
}

// stateFlag adds --state, read from envs (the command's own, if any) and
// AIRLOCK_STATE, default defaultStateDir.
func stateFlag(cmd *cobra.Command, p *string, envs ...string) {
	cmd.Flags().StringVar(p, "state", defaultStateDir, "state directory `DIR` of the gateway: keys, certificate, tokens, lease history, admin socket")
	_ = cmd.MarkFlagDirname("state")
	setEnv(cmd.Flags().Lookup("state"), append(envs, "AIRLOCK_STATE")...)
}

// needState refuses an empty --state.
func needState(state string) error {
	if state == "" {
		return usagef("--state is empty: want the gateway's state directory (default %s)", defaultStateDir)
	}
	return nil
}

// jsonFlag adds --json.
func jsonFlag(cmd *cobra.Command, what string) *bool {
	return cmd.Flags().Bool("json", false, "print "+what+" as JSON on stdout, for scripts")
}

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// enumFlag completes a flag with a fixed list of values.
func enumFlag(cmd *cobra.Command, name string, values ...string) {
	_ = cmd.RegisterFlagCompletionFunc(name, cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp))
}

// noArgs accepts no positional arguments; for a command with subcommands
// it says which command was not found, and suggests one.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	if cmd.HasAvailableSubCommands() {
		cmd.SuggestionsMinimumDistance = 2
		msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
		if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
			msg += "; did you mean " + strings.Join(s, " or ") + "?"
		}
		return usageError{errors.New(msg)}
	}
	return usagef("unexpected arguments %q", args)
}

// exactArgs accepts n positional arguments, named what in the error.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("want %s, got %d arguments", what, len(args))
		}
		return nil
	}
}

// needSubcommand is the RunE of a command that only groups others.
func needSubcommand(cmd *cobra.Command, args []string) error {
	var names []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() {
			names = append(names, c.Name())
		}
	}
	return usagef("missing subcommand: want one of %s", strings.Join(names, ", "))
}

// longFlagsCompat rewrites -name and -name=value to --name, for the long
// flags of the command args name, where Go's flag package would have read
// a flag: before the first argument that is not a flag (run), or anywhere
// before "--" (commands that accept flags after their arguments). It
// warns once on w, and leaves everything else as it is: a one-letter
// flag, a job's own arguments after `airlock run CMD`, a word that names
// no flag.
func longFlagsCompat(root *cobra.Command, args []string, w io.Writer) []string {
	cmd := root
	out := append([]string(nil), args...)
	var fixed []string
	positional := false
	for i := 0; i < len(out); i++ {
		a := out[i]
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			if !positional {
				if sub, _, err := cmd.Find([]string{a}); err == nil && sub != cmd && sub.Parent() == cmd {
					cmd = sub
					continue
				}
			}
			positional = true
			if !cmd.Flags().HasFlags() || !interspersed(cmd) {
				break
			}
			continue
		}
		name, hasValue := strings.TrimLeft(a, "-"), false
		if i := strings.IndexByte(name, '='); i >= 0 {
			name, hasValue = name[:i], true
		}
		f := lookupFlag(cmd, name)
		if !strings.HasPrefix(a, "--") {
			if len(name) == 1 {
				f = cmd.Flags().ShorthandLookup(name)
				if f == nil {
					f = cmd.InheritedFlags().ShorthandLookup(name)
				}
			} else if f != nil {
				out[i] = "-" + a
				fixed = append(fixed, "-"+name)
			}
		}
		if f != nil && !hasValue && f.NoOptDefVal == "" {
			i++ // the flag's value, whatever it looks like
		}
	}
	if len(fixed) > 0 {
		fmt.Fprintf(w, "airlock: warning: read %s as -%s: write long flags with two dashes\n", strings.Join(fixed, ", "), strings.Join(fixed, ", -"))
	}
	return out
}

// lookupFlag finds a long flag of cmd, its parents' persistent ones and
// the help and version flags cobra adds when it runs.
func lookupFlag(cmd *cobra.Command, name string) *pflag.Flag {
	if f := cmd.Flags().Lookup(name); f != nil {
		return f
	}
	if f := cmd.InheritedFlags().Lookup(name); f != nil {
		return f
	}
	if name == "help" || name == "version" && !cmd.HasParent() {
		return &pflag.Flag{Name: name, NoOptDefVal: "true"}
	}
	return nil
}

// flagsEndAtArgs makes cmd's flags end at its first argument (run: what
// follows is the job's command line), as Go's flag package did.
func flagsEndAtArgs(cmd *cobra.Command) {
	cmd.Flags().SetInterspersed(false)
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[noInterspersed] = "true"
}

// interspersed reports whether cmd reads flags after its arguments.
func interspersed(cmd *cobra.Command) bool {
	return cmd.Annotations[noInterspersed] == ""
}

// noInterspersed, in a command's annotations, marks flagsEndAtArgs.
const noInterspersed = "airlock_flags_end_at_args"
