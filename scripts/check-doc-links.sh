#!/usr/bin/env bash
# Every relative link in README.md and docs/*.md must resolve: the file
# exists and, for a #fragment, the target has a heading with that anchor
# (GitHub's rule: lower case, punctuation dropped, spaces to hyphens).
# Links inside code blocks and code spans are not links. Perl, because
# scripts/mutants.pl already needs it. Exit 1 and name each broken link.
set -euo pipefail
cd "$(dirname "$0")/.."
exec perl -e '
use strict; use warnings;
use File::Basename qw(dirname);
my %anchors;
sub lines_outside_code {
    my ($f) = @_;
    open(my $h, "<", $f) or return ();
    my ($in, @out) = (0);
    while (my $l = <$h>) {
        if ($l =~ /^\s*```/) { $in = !$in; next; }
        push @out, [$., $l] unless $in;
    }
    return @out;
}
sub anchors_of {
    my ($f) = @_;
    return $anchors{$f} if $anchors{$f};
    my %a;
    for my $p (lines_outside_code($f)) {
        my $l = $p->[1];
        next unless $l =~ /^#+\s+(.*?)\s*$/;
        my $id = lc $1;
        $id =~ s/[^a-z0-9 _\-]//g;
        $id =~ s/ /-/g;
        my $n = $id; my $i = 1;
        while ($a{$n}) { $n = "$id-" . $i++; }
        $a{$n} = 1;
    }
    return $anchors{$f} = \%a;
}
my $bad = 0;
for my $f (@ARGV) {
    for my $p (lines_outside_code($f)) {
        my ($no, $l) = @$p;
        my $t = $l;
        $t =~ s/`[^`]*`//g;
        while ($t =~ /\]\(([^)\s]+)\)/g) {
            my $link = $1;
            next if $link =~ m{^[a-z]+:}i;
            my ($path, $frag) = split /#/, $link, 2;
            my $target = $path eq "" ? $f : dirname($f) . "/" . $path;
            if (!-e $target) {
                print "$f:$no: $link: no file $target\n"; $bad = 1; next;
            }
            next unless defined $frag && $target =~ /\.md$/;
            if (!anchors_of($target)->{$frag}) {
                print "$f:$no: $link: no heading #$frag in $target\n"; $bad = 1;
            }
        }
    }
}
exit $bad;
' README.md docs/*.md
