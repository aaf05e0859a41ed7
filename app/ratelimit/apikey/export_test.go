package apikey

// ValidSecret is validSecret, for the external tests.
var ValidSecret = validSecret

// MaxIDBytes exposes maxIDBytes to the external tests.
const MaxIDBytes = maxIDBytes
