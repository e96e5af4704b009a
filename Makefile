# The two commands a fresh machine needs; each installs what is missing itself.
.PHONY: test demo bench soak

test:
	bash scripts/test.sh

demo:
	bash scripts/demo.sh

bench:
	bash scripts/bench.sh

soak:
	bash scripts/soak.sh
