package docscheck

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"time"
)

// Invocation is one command a document shows, as shell words.
type Invocation struct {
	// Args are the words after the program name, quotes removed.
	Args []string
	// Where is "FILE:LINE" of the line that shows it.
	Where string
}

// kvthrottleWord finds the program name kvthrottle (or a path ending in
// /kvthrottle) as a command word: at the start, or after white space, a
// pipe, a ';', a '&' or a '('. kvthrottle_units_total and KVTHROTTLE_X do
// not match.
var kvthrottleWord = regexp.MustCompile(`(?:^|[\s|;&(])(?:[\w./-]*/)?kvthrottle(?:\s|$)`)

// KvthrottleInvocations returns the kvthrottle commands of the sh blocks
// of the Markdown document md (named file in Where), anywhere on a line:
// in a pipeline, after variable assignments, inside $(...).
func KvthrottleInvocations(file, md string) []Invocation {
	var out []Invocation
	eachShLine(file, md, func(line, where string) {
		for _, loc := range kvthrottleWord.FindAllStringIndex(line, -1) {
			out = append(out, Invocation{Args: shellWords(line[loc[1]:]), Where: where})
		}
	})
	return out
}

// MakeInvocations returns the make commands of the sh blocks of md: the
// words after "make" at the start of a line.
func MakeInvocations(file, md string) []Invocation {
	var out []Invocation
	eachShLine(file, md, func(line, where string) {
		if w := shellWords(line); len(w) > 0 && w[0] == "make" {
			out = append(out, Invocation{Args: w[1:], Where: where})
		}
	})
	return out
}

// eachShLine calls f with every line of the sh blocks of md and its
// "FILE:LINE".
func eachShLine(file, md string, f func(line, where string)) {
	for _, b := range Blocks(md) {
		if b.Lang != "sh" {
			continue
		}
		for i, line := range strings.Split(b.Body, "\n") {
			f(line, fmt.Sprintf("%s:%d", file, b.Line+1+i))
		}
	}
}

// shellWords splits s into words as a POSIX shell would for a simple
// command, with '…' and "…" quoting and backslash escapes, up to the first
// unquoted |, ;, &, ), <, > or a # that starts a word. Expansions are
// left as written.
func shellWords(s string) []string {
	var words []string
	var w strings.Builder
	inWord := false
	end := func() {
		if inWord {
			words = append(words, w.String())
		}
		w.Reset()
		inWord = false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				j = len(s) - i - 1
			}
			w.WriteString(s[i+1 : i+1+j])
			inWord, i = true, i+1+j
		case c == '"':
			j := i + 1
			for ; j < len(s) && s[j] != '"'; j++ {
				if s[j] == '\\' && j+1 < len(s) {
					j++
				}
				w.WriteByte(s[j])
			}
			inWord, i = true, j
		case c == '\\' && i+1 < len(s):
			i++
			w.WriteByte(s[i])
			inWord = true
		case c == ' ' || c == '\t':
			end()
		case strings.IndexByte("|;&)<>", c) >= 0, c == '#' && !inWord:
			end()
			return words
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	end()
	return words
}

// makeTarget matches a rule's targets in a Makefile.
var makeTarget = regexp.MustCompile(`(?m)^([A-Za-z0-9_.-]+(?:\s+[A-Za-z0-9_.-]+)*)\s*:([^=]|$)`)

// MakeTargets returns the targets the Makefile defines.
func MakeTargets(makefile string) map[string]bool {
	out := map[string]bool{}
	for _, m := range makeTarget.FindAllStringSubmatch(makefile, -1) {
		for _, t := range strings.Fields(m[1]) {
			out[t] = true
		}
	}
	return out
}

// CheckMake returns what is wrong with a make invocation given the
// Makefile's targets: a word that is neither a VAR=value assignment nor
// a target, or no target at all.
func CheckMake(inv Invocation, targets map[string]bool) error {
	n := 0
	for _, a := range inv.Args {
		if strings.Contains(a, "=") {
			continue
		}
		if !targets[a] {
			return fmt.Errorf("%s: make %s: the Makefile has no target %q", inv.Where, strings.Join(inv.Args, " "), a)
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("%s: make without a target", inv.Where)
	}
	return nil
}

// Checker checks kvthrottle invocations against a built binary: the
// sub-command exists, the binary accepts every flag given (it is run with
// the same words and --help), and for ctl the command exists and has as
// many arguments as ctl's usage says.
type Checker struct {
	// Bin is the kvthrottle binary.
	Bin string

	subs map[string]bool
	ctl  ctlUsage
}

// ctlUsage is what `kvthrottle ctl --help` says: its commands with their
// least and most arguments, and which flags take a value.
type ctlUsage struct {
	commands  map[string][2]int
	valueFlag map[string]bool
}

// NewChecker reads the usages of bin.
func NewChecker(bin string) (*Checker, error) {
	c := &Checker{Bin: bin, subs: map[string]bool{}}
	top, _, err := c.run("--help")
	if err != nil {
		return nil, fmt.Errorf("kvthrottle --help: %w", err)
	}
	for _, m := range regexp.MustCompile(`(?m)^\s+kvthrottle ([a-z-]+)`).FindAllStringSubmatch(top, -1) {
		c.subs[m[1]] = true
	}
	help, _, err := c.run("ctl", "--help")
	if err != nil {
		return nil, fmt.Errorf("kvthrottle ctl --help: %w", err)
	}
	c.ctl = parseCtlUsage(help)
	if len(c.subs) == 0 || len(c.ctl.commands) == 0 || len(c.ctl.valueFlag) == 0 {
		return nil, fmt.Errorf("cannot read the usage: sub-commands %v, ctl commands %v, ctl value flags %v",
			c.subs, c.ctl.commands, c.ctl.valueFlag)
	}
	return c, nil
}

// parseCtlUsage reads ctl's "commands:" section (a command, then its
// arguments as UPPER words, optional ones in brackets) and its "flags:"
// section (--name VALUE takes a value, --name alone does not).
func parseCtlUsage(help string) ctlUsage {
	u := ctlUsage{commands: map[string][2]int{}, valueFlag: map[string]bool{}}
	section := ""
	cmdLine := regexp.MustCompile(`^  ([a-z][a-z-]*)((?: \[?[A-Z]+\]?)*)(?:\s{2,}|$)`)
	flag := regexp.MustCompile(`--([a-z][a-z-]*)( [A-Z][A-Z:]*)?`)
	for _, line := range strings.Split(help, "\n") {
		if strings.HasSuffix(line, ":") && !strings.HasPrefix(line, " ") {
			section = strings.TrimSuffix(line, ":")
			continue
		}
		switch section {
		case "commands":
			if m := cmdLine.FindStringSubmatch(line); m != nil {
				var n [2]int
				for _, a := range strings.Fields(m[2]) {
					if !strings.HasPrefix(a, "[") {
						n[0]++
					}
					n[1]++
				}
				u.commands[m[1]] = n
			}
		case "flags":
			if !strings.HasPrefix(strings.TrimSpace(line), "--") {
				continue // a continuation of the description
			}
			desc := strings.TrimSpace(line)
			if i := strings.Index(desc, "  "); i >= 0 {
				desc = desc[:i] // the flags, not their description
			}
			for _, m := range flag.FindAllStringSubmatch(desc, -1) {
				u.valueFlag[m[1]] = m[2] != ""
			}
		}
	}
	return u
}

// Check returns what is wrong with inv, or nil.
func (c *Checker) Check(inv Invocation) error {
	cmdline := "kvthrottle " + strings.Join(inv.Args, " ")
	if len(inv.Args) == 0 {
		return fmt.Errorf("%s: %s: no sub-command", inv.Where, cmdline)
	}
	if !c.subs[inv.Args[0]] {
		return fmt.Errorf("%s: %s: kvthrottle --help lists no sub-command %q", inv.Where, cmdline, inv.Args[0])
	}
	out, code, err := c.run(append(append([]string(nil), inv.Args...), "--help")...)
	if err != nil || code != 0 || strings.Contains(out, "not defined") {
		return fmt.Errorf("%s: %s: the binary refuses these words (run with --help: exit %d, %v):\n%s", inv.Where, cmdline, code, err, out)
	}
	if inv.Args[0] == "ctl" {
		return c.checkCtl(inv, cmdline)
	}
	return nil
}

// checkCtl checks ctl's command and its number of arguments.
func (c *Checker) checkCtl(inv Invocation, cmdline string) error {
	var pos []string
	args := inv.Args[1:]
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if strings.HasPrefix(a, "-") && len(a) > 1 {
			name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if c.ctl.valueFlag[name] && !hasValue {
				i++
			}
			continue
		}
		pos = append(pos, a)
	}
	if len(pos) == 0 {
		return fmt.Errorf("%s: %s: no ctl command", inv.Where, cmdline)
	}
	n, ok := c.ctl.commands[pos[0]]
	switch {
	case !ok:
		return fmt.Errorf("%s: %s: kvthrottle ctl --help lists no command %q", inv.Where, cmdline, pos[0])
	case len(pos)-1 < n[0] || len(pos)-1 > n[1]:
		return fmt.Errorf("%s: %s: ctl %s takes %d to %d arguments, got %d", inv.Where, cmdline, pos[0], n[0], n[1], len(pos)-1)
	}
	return nil
}

// run runs the binary with args, no standard input and a clean password
// variable, and returns its combined output and exit code.
func (c *Checker) run(args ...string) (string, int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.Bin, args...)
	cmd.Env = append(os.Environ(), "KVTHROTTLE_PASSWORD=unused")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return out.String(), ee.ExitCode(), nil
	}
	return out.String(), 0, err
}
