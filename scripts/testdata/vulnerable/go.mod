module vulnselftest

go 1.26

require golang.org/x/text v0.3.5
