package native

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// <run>/stack.env: the saved settings, NAME=value lines a shell can source
// (scripts/measure-drain.sh does; scripts/keys.sh reads one value), values
// quoted the shell's way when they need it.

// saveSettings writes <run>/stack.env, mode 600 (it holds the password).
func (s Settings) saveSettings() error {
	var b strings.Builder
	b.WriteString("# written by localstack up (make local-up): the settings of the running native stack\n")
	for _, v := range variables {
		if v.Saved {
			fmt.Fprintf(&b, "%s=%s\n", v.Name, shellQuote(v.get(&s)))
		}
	}
	if err := os.MkdirAll(s.RunDir, 0o755); err != nil {
		return err
	}
	return writeFile(filepath.Join(s.RunDir, stackEnv), []byte(b.String()), 0o600)
}

// shellQuote returns s as one shell word: as it is when it holds only
// characters no shell treats specially, else in single quotes.
func shellQuote(s string) string {
	if s == "" {
		return "''"
	}
	if strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:,@%+=-") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// readEnvFile reads NAME=value assignments, one per line, as a shell would
// (the quoting: '...', "..." with \ before " \ $ `, \ outside quotes; a
// newline inside quotes is kept); # starts a comment line.
func readEnvFile(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseEnv(string(b))
}

func parseEnv(text string) (map[string]string, error) {
	out := map[string]string{}
	line := 1
	for i := 0; i < len(text); {
		switch c := text[i]; {
		case c == '\n':
			line++
			i++
			continue
		case c == ' ' || c == '\t':
			i++
			continue
		case c == '#':
			for i < len(text) && text[i] != '\n' {
				i++
			}
			continue
		}
		eq := strings.IndexByte(text[i:], '=')
		nl := strings.IndexByte(text[i:], '\n')
		if eq < 0 || nl >= 0 && nl < eq {
			return nil, fmt.Errorf("line %d: not NAME=value", line)
		}
		name := text[i : i+eq]
		i += eq + 1
		var v strings.Builder
	word:
		for i < len(text) {
			switch c := text[i]; c {
			case '\n', ' ', '\t':
				break word
			case '\'':
				end := strings.IndexByte(text[i+1:], '\'')
				if end < 0 {
					return nil, fmt.Errorf("line %d: %s: unterminated '", line, name)
				}
				v.WriteString(text[i+1 : i+1+end])
				line += strings.Count(text[i+1:i+1+end], "\n")
				i += end + 2
			case '"':
				i++
				for ; i < len(text) && text[i] != '"'; i++ {
					if text[i] == '\\' && i+1 < len(text) && strings.IndexByte("\"\\$`", text[i+1]) >= 0 {
						i++
					}
					if text[i] == '\n' {
						line++
					}
					v.WriteByte(text[i])
				}
				if i >= len(text) {
					return nil, fmt.Errorf("line %d: %s: unterminated \"", line, name)
				}
				i++
			case '\\':
				if i+1 < len(text) && text[i+1] != '\n' {
					v.WriteByte(text[i+1])
				}
				i += 2
			default:
				v.WriteByte(c)
				i++
			}
		}
		if name == "" || name[0] >= '0' && name[0] <= '9' || strings.Trim(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_") != "" {
			return nil, fmt.Errorf("line %d: %q is not a variable name", line, name)
		}
		out[name] = v.String()
	}
	return out, nil
}

// savedTopology is LOCAL_TOPOLOGY of runDir's stack.env: single when it
// has none or there is no stack.env.
func savedTopology(runDir string) string {
	saved, _ := readEnvFile(filepath.Join(runDir, stackEnv))
	if t := saved["LOCAL_TOPOLOGY"]; t != "" {
		return t
	}
	return string(Single)
}
