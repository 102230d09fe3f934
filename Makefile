.PHONY: build test dev clean

build:
	go build -o bin/gateway ./cmd/gateway

# The test command: starts the services the tests need from scratch.
test:
	scripts/test.sh

clean:
	rm -rf bin var
