#!/usr/bin/perl
# The text side of `make mutants` (scripts/mutants.sh runs the builds and
# the tests): reads tests/mutants/*.mutant files (format in
# tests/mutants/README.md) and applies one to a copy of the tree.
#
#   mutants.pl check TREE MUTANT...
#       one line per mutant, tab-separated: name, status (ok, STALE or
#       INVALID), file, tests, and what is wrong. Nothing is written.
#   mutants.pl apply TREE MUTANT SAVE
#       copies the file the mutant names to SAVE, then writes the mutated
#       text over it. Exit status 0, or 1 with the reason on stderr.
use strict;
use warnings;

sub slurp {
    my ($path) = @_;
    open(my $fh, '<:raw', $path) or return undef;
    local $/;
    my $text = <$fh>;
    close $fh;
    return $text;
}

sub spew {
    my ($path, $text) = @_;
    open(my $fh, '>:raw', $path) or die "cannot write $path: $!\n";
    print $fh $text or die "cannot write $path: $!\n";
    close $fh or die "cannot write $path: $!\n";
}

# Returns {file, tests, blocks => [[original, replacement], ...]}; dies
# with "line N: what" on anything outside the format.
sub parse {
    my ($path) = @_;
    my $text = slurp($path) // die "cannot read: $!\n";
    my @lines = split /\n/, $text, -1;
    pop @lines if @lines && $lines[-1] eq '';
    my (%m, $comments, $state, @orig, @repl);
    $m{blocks} = [];
    my $n = 0;
    for my $line (@lines) {
        $n++;
        if (!defined $state) {
            if ($line eq '<<<') {
                $state = 'orig';
                @orig = @repl = ();
            } elsif ($line =~ /^#/) {
                $comments++ unless @{$m{blocks}};
            } elsif ($line =~ /^(file|tests):\s*(\S.*?)\s*$/) {
                die "line $n: '$1:' is given twice\n" if exists $m{$1};
                die "line $n: '$1:' after a block\n" if @{$m{blocks}};
                $m{$1} = $2;
            } elsif ($line !~ /^\s*$/) {
                die "line $n: expected a comment, 'file:', 'tests:' or "
                    . "'<<<', got '$line'\n";
            }
        } elsif ($state eq 'orig') {
            if ($line eq '===') {
                die "line $n: empty original text\n" unless @orig;
                $state = 'repl';
            } else {
                push @orig, $line;
            }
        } elsif ($line eq '>>>') {
            push @{$m{blocks}}, [join('', map { "$_\n" } @orig),
                                 join('', map { "$_\n" } @repl)];
            undef $state;
        } else {
            push @repl, $line;
        }
    }
    die "unterminated block at the end\n" if defined $state;
    die "no comment saying which promise it breaks\n" unless $comments;
    die "no 'file:' line\n" unless $m{file};
    die "no 'tests:' line\n" unless $m{tests};
    die "no <<< === >>> block\n" unless @{$m{blocks}};
    die "'file:' must be a path inside the repository\n"
        if $m{file} =~ m{^/|(^|/)\.\.(/|$)};
    # The filter goes through make and the shell inside single quotes.
    die "'tests:' may not hold quotes or backslashes\n"
        if $m{tests} =~ /['"\\]/;
    return \%m;
}

# Whole-line occurrences of $needle (lines ending in "\n") in $text.
sub positions {
    my ($text, $needle) = @_;
    my @at;
    my $from = 0;
    while ((my $i = index($text, $needle, $from)) >= 0) {
        push @at, $i if $i == 0 || substr($text, $i - 1, 1) eq "\n";
        $from = $i + 1;
    }
    return @at;
}

# The mutated text, or dies saying which block does not apply.
sub mutate {
    my ($m, $text) = @_;
    my $original = $text;
    my $b = 0;
    for my $block (@{$m->{blocks}}) {
        my ($orig, $repl) = @$block;
        $b++;
        my @at = positions($text, $orig);
        die "block $b: its original text occurs " . scalar(@at)
            . " times in $m->{file}, not once\n" if @at != 1;
        substr($text, $at[0], length $orig) = $repl;
    }
    die "it changes nothing\n" if $text eq $original;
    return $text;
}

sub name_of {
    my ($path) = @_;
    (my $name = $path) =~ s{^.*/}{};
    $name =~ s{\.mutant$}{};
    return $name;
}

my $cmd = shift @ARGV // '';
if ($cmd eq 'check') {
    my $tree = shift @ARGV;
    for my $path (@ARGV) {
        my $name = name_of($path);
        my $m = eval { parse($path) };
        if (!$m) {
            chomp(my $e = $@);
            print join("\t", $name, 'INVALID', '-', '-', $e), "\n";
            next;
        }
        my $text = slurp("$tree/$m->{file}");
        my $why = defined $text ? (eval { mutate($m, $text); '' } // $@)
                                : "no file $m->{file}\n";
        chomp $why;
        print join("\t", $name, $why eq '' ? 'ok' : 'STALE', $m->{file},
                   $m->{tests}, $why), "\n";
    }
} elsif ($cmd eq 'apply' && @ARGV == 3) {
    my ($tree, $path, $save) = @ARGV;
    my $ok = eval {
        my $m = parse($path);
        my $target = "$tree/$m->{file}";
        my $text = slurp($target) // die "cannot read $target: $!\n";
        my $mutated = mutate($m, $text);
        spew($save, $text);
        spew($target, $mutated);
        1;
    };
    if (!$ok) {
        print STDERR name_of($path), ": $@";
        exit 1;
    }
} else {
    print STDERR "usage: mutants.pl check TREE MUTANT... | "
        . "apply TREE MUTANT SAVE\n";
    exit 2;
}
