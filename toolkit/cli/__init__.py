"""The command line: parse options, call one library function, render the result."""
