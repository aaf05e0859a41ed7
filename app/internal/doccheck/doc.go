// Package doccheck holds the repository's checks of its own prose: the
// docs and comments name tests that exist, and the README's Go snippets
// are the examples as they compile and run. It has no code of its own.
package doccheck
