package apikey

// ValidSecret is validSecret, for the external tests.
var ValidSecret = validSecret
