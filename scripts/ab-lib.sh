# ab-lib.sh: what scripts/bench-*-ab.sh share, sourced after `set -euo
# pipefail`: ab_setup REV builds commit REV in a worktree of its own
# beside the working tree, both with `make build`, and sets repo (the
# working tree), old and head (their short names; head gets "+changes"
# when the tree has uncommitted changes to tracked files) and work (a
# scratch directory: the worktree is $work/old). Both are removed on exit.
ab_setup() {
	repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
	cd "$repo"
	old=$(git rev-parse --short "$1^{commit}")
	head=$(git rev-parse --short HEAD)
	[ -z "$(git status --porcelain --untracked-files=no)" ] || head="$head+changes"
	work=$(mktemp -d)
	trap ab_cleanup EXIT
	echo "building $old (worktree) and the working tree ($head)" >&2
	git worktree add --detach "$work/old" "$old" >/dev/null 2>&1
	make -C "$work/old" -s build >/dev/null
	make -C "$repo" -s build >/dev/null
}

ab_cleanup() {
	git -C "$repo" worktree remove --force "$work/old" >/dev/null 2>&1 || true
	rm -rf "$work"
}
