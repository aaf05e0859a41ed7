package lease

// MinUnits is minUnits, for the external tests.
const MinUnits = minUnits
