// Package doccheck holds the repository's checks of its own prose: the
// docs and comments name tests that exist. It has no code of its own.
package doccheck
