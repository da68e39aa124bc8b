"""Hand-written leads of the built-in sample's articles (original text, written for bertpipe).

Each entry: (title, lead wikitext, facts). ``facts`` feed the generated body paragraphs of make_sample.py:
``thing`` (how the text names the subject), ``made`` (what it is made of or from), ``use`` (what it is for),
``meaning`` (what its name meant), ``cat`` (its category).
"""

from __future__ import annotations

ARTICLES: list[tuple[str, str, dict[str, str]]] = [
    ("Lighthouse", """A '''lighthouse''' is a tower that carries a bright lamp to guide ships at night. \
Most were built on rocky coasts, on islands or at the mouths of [[harbour]]s. \
The keeper's work was to trim the wick, wind the clockwork and keep the lens clean.<ref>{{cite book|title=Lights of the Coast|year=1988}}</ref> \
As of {{CURRENTYEAR}}, almost every light is automatic, and many towers are museums.""",
     {"thing": "lighthouse", "made": "stone and cast iron", "use": "warning ships away from rocks",
      "meaning": "a tower of fire", "cat": "Maritime buildings"}),
    ("Sourdough", """'''Sourdough''' is bread raised by a culture of wild yeast and lactic acid bacteria instead of baker's yeast. \
The baker keeps a ''starter'', a paste of flour and water that is fed every day. \
A loaf takes a long time to rise, often a whole night, and the crumb tastes slightly sour. \
Bakers in [[San Francisco]] and in the villages of the [[Alps]] each claim the oldest starter.""",
     {"thing": "starter", "made": "flour and water", "use": "raising bread",
      "meaning": "sour dough", "cat": "Breads"}),
    ("Violin", """The '''violin''' is a bowed string instrument with four strings tuned in fifths (G, D, A and E). \
It is the smallest and highest member of its family, which also includes the [[viola]] and the [[cello]]. \
Its body is carved from spruce and maple, and the bow is strung with horsehair. \
Famous workshops stood in [[Cremona]], where makers such as {{nowrap|Antonio Stradivari}} worked around 1700.""",
     {"thing": "violin", "made": "spruce and maple", "use": "playing melodies",
      "meaning": "a small viol", "cat": "String instruments"}),
    ("Bicycle", """A '''bicycle''' (also ''bike'' or ''cycle'') is a vehicle with two wheels, one behind the other, driven by pedals. \
The rider steers with handlebars and balances by small movements of the body. \
Early models of the 1860s had a huge front wheel; the "safety bicycle" with a chain came in the 1880s. \
There are more than a billion bicycles in the world today 🚲, more than cars.""",
     {"thing": "bicycle", "made": "steel tubes and rubber", "use": "travelling short distances",
      "meaning": "two circles", "cat": "Vehicles"}),
    ("Tea", """'''Tea''' is a drink made by pouring hot water over the cured leaves of ''Camellia sinensis''. \
It began in southwest China (茶, ''chá''), where it was first used as a medicine. \
Green, oolong and black tea differ in how long the leaves are left to oxidise. \
After water, tea is the most widely drunk beverage on Earth.""",
     {"thing": "tea bush", "made": "leaves and buds", "use": "making a hot drink",
      "meaning": "the leaf", "cat": "Beverages"}),
    ("River delta", """A '''river delta''' is a landform made of sediment that a river drops where it meets slower water. \
The river splits into many channels, called distributaries, which shift over the years. \
Deltas are usually flat and fertile, so they are often farmed and crowded with people. \
The [[Nile]] delta gave the landform its name, from the Greek letter Δ.""",
     {"thing": "delta", "made": "silt, sand and clay", "use": "farming and fishing",
      "meaning": "shaped like the letter delta", "cat": "Landforms"}),
    ("Honeybee", """The '''honeybee''' is a social insect that lives in colonies of many thousand workers, a few hundred drones and one queen. \
Workers collect nectar and pollen and turn the nectar into honey, which they store in wax cells. \
A returning forager "dances" to tell the others the direction and distance of food. \
Beekeepers have kept honeybees in hives of straw, clay and wood for thousands of years.""",
     {"thing": "hive", "made": "wax and propolis", "use": "making honey",
      "meaning": "the honey fly", "cat": "Insects"}),
    ("Glacier", """A '''glacier''' is a large, slow river of ice that forms where more snow falls than melts. \
Under its own weight the snow turns into dense ice and begins to flow downhill. \
Glaciers carve valleys into a U shape and leave behind ridges of rock called [[moraine]]s. \
Most glaciers in the world have grown shorter during the last hundred years.""",
     {"thing": "glacier", "made": "compressed snow", "use": "storing fresh water",
      "meaning": "ice", "cat": "Ice"}),
    ("Printing press", """A '''printing press''' presses an inked surface onto paper or cloth to copy text and pictures. \
In the 1440s Johannes Gutenberg combined movable metal type, oil-based ink and a screw press. \
Books became much cheaper, and within fifty years presses worked in more than two hundred European towns. \
Earlier, printers in China and Korea had used wooden blocks and movable type (活字).""",
     {"thing": "press", "made": "oak beams and lead type", "use": "copying books",
      "meaning": "to push", "cat": "Printing"}),
    ("Chess", """'''Chess''' is a board game for two players played on a square board of 64 squares. \
Each player has sixteen pieces: a king, a queen, two rooks, two bishops, two knights and eight pawns. \
The goal is ''checkmate'': to attack the other king so that it cannot escape. \
The game came to Europe from Persia, where the king was called ''shāh''.""",
     {"thing": "chessboard", "made": "wood or stone", "use": "playing a game of strategy",
      "meaning": "the king", "cat": "Board games"}),
    ("Origami", """'''Origami''' (折り紙) is the art of folding paper into shapes without cutting or gluing it. \
A classic model is the crane, which some people fold a thousand times as a wish for good health. \
Modern designers use mathematics to plan very complex models, such as insects with thin legs. \
Engineers borrow origami folds to pack solar panels and airbags into small spaces.""",
     {"thing": "paper model", "made": "a single square of paper", "use": "decoration and teaching",
      "meaning": "folded paper", "cat": "Paper art"}),
    ("Volcano", """A '''volcano''' is an opening in the crust of a planet through which molten rock, ash and gas escape. \
When the molten rock reaches the surface it is called [[lava]]. \
Some volcanoes erupt gently for years; others explode after centuries of silence. \
The word comes from Vulcano, a small island near Sicily that the Romans linked with the god of fire.""",
     {"thing": "volcano", "made": "layers of ash and lava", "use": "creating new land",
      "meaning": "the forge of the fire god", "cat": "Landforms"}),
    ("Windmill", """A '''windmill''' turns the energy of the wind into the rotation of a shaft by means of sails or blades. \
For centuries windmills ground grain and pumped water out of low land. \
In the Netherlands, thousands of mills kept the polders dry. \
Modern wind turbines are their descendants, but they make electricity instead.""",
     {"thing": "windmill", "made": "timber and canvas", "use": "grinding grain",
      "meaning": "a mill of the wind", "cat": "Mills"}),
    ("Coral reef", """A '''coral reef''' is an underwater ridge built by colonies of tiny animals called coral polyps. \
The polyps grow skeletons of calcium carbonate and live together with algae that give them food and colour. \
Reefs cover less than one percent of the sea floor but shelter about a quarter of all marine species. \
When the water gets too warm, the polyps expel the algae and the coral turns white.""",
     {"thing": "reef", "made": "limestone skeletons", "use": "sheltering fish",
      "meaning": "a ridge of rock", "cat": "Marine ecology"}),
    ("Telescope", """A '''telescope''' gathers light to make distant objects look nearer and brighter. \
The first ones, made in the Netherlands in 1608, used two lenses in a tube. \
Isaac Newton later built a telescope with a curved mirror, which avoids coloured fringes. \
Large observatories now sit on high mountains, and some telescopes orbit above the atmosphere.""",
     {"thing": "telescope", "made": "glass lenses and brass", "use": "observing the sky",
      "meaning": "far seeing", "cat": "Optical instruments"}),
    ("Silk Road", """The '''Silk Road''' was a network of trade routes that linked China with Central Asia, Persia and the Mediterranean. \
Merchants carried silk, paper and porcelain westward, and glass, wool and silver eastward. \
Ideas travelled too: religions, recipes, music and the technique of making paper. \
Few traders ever walked the whole way; goods passed from hand to hand through many markets.""",
     {"thing": "caravan", "made": "camels, horses and carts", "use": "carrying goods",
      "meaning": "the road of silk", "cat": "Trade routes"}),
    ("Pottery", """'''Pottery''' is the craft of shaping clay into vessels and hardening them with heat. \
Clay is shaped by hand or on a spinning wheel, dried, and fired in a [[kiln]]. \
A glaze, a thin layer of glass, can make the pot waterproof and colourful. \
Broken pieces, called sherds, survive for thousands of years and help archaeologists date a site.""",
     {"thing": "pot", "made": "clay", "use": "storing food and water",
      "meaning": "made by a potter", "cat": "Crafts"}),
    ("Tide", """The '''tide''' is the regular rise and fall of the sea, caused mainly by the pull of the Moon and the Sun. \
Most coasts have two high tides and two low tides every day. \
The difference between them ranges from a few centimetres to more than fifteen metres. \
Fishermen, sailors and birds that feed on mud flats all plan their day around it.""",
     {"thing": "tide", "made": "moving sea water", "use": "timing voyages and harvests",
      "meaning": "a time", "cat": "Oceanography"}),
    ("Compass", """A '''compass''' shows direction using a magnetised needle that lines up with the Earth's magnetic field. \
Sailors in China used such needles by the 11th century, and Europeans soon after. \
Magnetic north is not exactly the same as true north, so maps give a small correction. \
Hikers still carry one, because it works without batteries or a signal.""",
     {"thing": "compass", "made": "a magnetised needle and a card", "use": "finding direction",
      "meaning": "to pace around", "cat": "Navigation"}),
    ("Olive oil", """'''Olive oil''' is the fat pressed from the fruit of the olive tree. \
It has been made around the Mediterranean for at least six thousand years and was traded in clay jars. \
The best grade, ''extra virgin'', is pressed without heat or chemicals. \
It was also burned in lamps and used to make soap and perfume.""",
     {"thing": "olive press", "made": "stone wheels and mats", "use": "pressing oil",
      "meaning": "oil of the olive", "cat": "Food"}),
    ("Suspension bridge", """A '''suspension bridge''' hangs its deck from cables slung between tall towers. \
The main cables are anchored in heavy blocks at both ends of the bridge. \
This design can cross very long spans, more than a kilometre in some cases. \
Simple rope bridges of the same kind were built in the Andes and the Himalayas long ago.""",
     {"thing": "bridge", "made": "steel wire and concrete", "use": "crossing wide rivers",
      "meaning": "a hanging bridge", "cat": "Bridges"}),
    ("Kite", """A '''kite''' is a light frame covered with paper or cloth that flies on the wind while tied to a line. \
Kites were flown in China more than two thousand years ago, sometimes to send signals. \
Scientists have used kites to lift thermometers and cameras into the sky. \
In many countries a spring festival fills the sky with kites of every colour.""",
     {"thing": "kite", "made": "bamboo and paper", "use": "play and signalling",
      "meaning": "a bird of prey", "cat": "Toys"}),
    ("Desert", """A '''desert''' is a region that receives very little rain, usually less than 250 millimetres a year. \
Not all deserts are hot or sandy: [[Antarctica]] is the largest desert of all. \
Plants there store water in thick stems, and many animals come out only at night. \
Oases, where groundwater reaches the surface, have been stopping places for travellers for millennia.""",
     {"thing": "oasis", "made": "sand, rock and scarce water", "use": "resting on long journeys",
      "meaning": "an abandoned place", "cat": "Biomes"}),
    ("Library", """A '''library''' is a collection of books and other media kept for people to read, borrow or study. \
The library of Alexandria was the most famous of the ancient world. \
Public libraries open to everyone spread in the 19th century. \
Today libraries lend e-books, teach computer skills and offer a quiet place to work.""",
     {"thing": "library", "made": "shelves, catalogues and books", "use": "lending books",
      "meaning": "a place of books", "cat": "Libraries"}),
    ("Penguin", """'''Penguins''' are flightless seabirds of the southern hemisphere. \
Their wings have become stiff flippers, and they "fly" through the water after fish and krill. \
The emperor penguin breeds during the Antarctic winter; the male keeps the egg warm on his feet for about two months. \
Some species live as far north as the Galápagos Islands, near the equator.""",
     {"thing": "penguin colony", "made": "thousands of nesting birds", "use": "raising chicks",
      "meaning": "white head", "cat": "Birds"}),
    ("Mechanical clock", """A '''mechanical clock''' measures time with a regular motion, such as a swinging pendulum or a balance wheel. \
The first ones appeared in the towers of European churches and town halls around 1300. \
They had no face at first; they simply struck a bell every hour. \
Christiaan Huygens made the pendulum clock in 1656, and it kept time to within a minute a day.""",
     {"thing": "clock", "made": "brass gears and springs", "use": "keeping time",
      "meaning": "a bell", "cat": "Timekeeping"}),
    ("Rice terrace", """A '''rice terrace''' is a flat step cut into a hillside so that rice can grow in standing water. \
Stone or earth walls hold each step, and channels carry water from one level to the next. \
The terraces of the Philippine Cordilleras and of Yunnan (云南) are famous for their beauty. \
Keeping them requires the work of a whole village every year.""",
     {"thing": "terrace", "made": "earth walls and flooded fields", "use": "growing rice on slopes",
      "meaning": "a raised bank", "cat": "Agriculture"}),
    ("Mosaic", """A '''mosaic''' is a picture made of many small pieces of stone, glass or tile, called ''tesserae''. \
The Romans covered floors with mosaics of hunters, fish and gods. \
Byzantine churches used gold glass so that the walls seemed to shine in candlelight. \
Modern artists make mosaics from broken plates, bottle caps and even pixels.""",
     {"thing": "mosaic", "made": "small tiles set in mortar", "use": "decorating floors and walls",
      "meaning": "belonging to the Muses", "cat": "Visual arts"}),
    ("Rainbow", """A '''rainbow''' is an arc of colours that appears when sunlight shines through drops of water. \
Each drop bends the light, reflects it once inside, and splits it into its colours. \
The sun must be behind the viewer, so rainbows are seen in the morning or evening sky opposite the sun. \
A fainter second bow, with its colours reversed, sometimes appears outside the first.""",
     {"thing": "rainbow", "made": "sunlight and rain drops", "use": "teaching how light bends",
      "meaning": "a bow in the rain", "cat": "Optical phenomena"}),
    ("Canal", """A '''canal''' is an artificial waterway built for boats or to carry water to fields and towns. \
Locks, chambers with gates at both ends, lift boats from one level to another. \
The Grand Canal of China, begun in the 5th century BC, is the longest in the world. \
Horses once walked along towpaths beside the water, pulling barges loaded with coal and grain.""",
     {"thing": "canal", "made": "dug earth and brick locks", "use": "moving heavy loads by water",
      "meaning": "a pipe", "cat": "Waterways"}),
    ("Typewriter", """A '''typewriter''' is a machine for writing letters by striking inked ribbon against paper. \
The QWERTY layout, still used on computer keyboards, was designed for it in the 1870s. \
Offices employed rooms full of typists until personal computers replaced the machines in the 1980s. \
Some writers still prefer its noise and the fact that it cannot be hacked.""",
     {"thing": "typewriter", "made": "steel levers and a rubber platen", "use": "writing letters",
      "meaning": "a writer of type", "cat": "Office equipment"}),
    ("Mushroom", """A '''mushroom''' is the fleshy fruiting body of a fungus, grown above ground to spread spores. \
Most of the fungus lives hidden in the soil as a web of threads called mycelium. \
Some mushrooms are delicious, while others, like the death cap, are deadly. \
Forests depend on fungi, which break down dead wood and share nutrients with tree roots.""",
     {"thing": "mushroom", "made": "fungal threads", "use": "spreading spores",
      "meaning": "moss", "cat": "Fungi"}),
    ("Sundial", """A '''sundial''' tells the time of day from the shadow that a pointer, the ''gnomon'', casts on a marked face. \
It must be set up for the latitude of the place where it stands. \
Sundials show local solar time, which can differ from clock time by up to a quarter of an hour. \
Many carry mottos such as ''tempus fugit'' ("time flies").""",
     {"thing": "sundial", "made": "bronze and stone", "use": "telling the hour",
      "meaning": "a dial of the sun", "cat": "Timekeeping"}),
    ("Paper", """'''Paper''' is a thin sheet made from pressed fibres of wood, rags or grasses. \
Its invention is credited to Cai Lun, a court official of the Han dynasty, in the year 105. \
Papermaking reached the Arab world in the 8th century and Europe some four hundred years later. \
Today most paper is made from wood pulp, and much of it is recycled.""",
     {"thing": "sheet of paper", "made": "plant fibres", "use": "writing and wrapping",
      "meaning": "papyrus", "cat": "Paper"}),
    ("Bamboo", """'''Bamboo''' is a group of fast-growing grasses with hollow, jointed stems. \
Some species can grow almost a metre in a single day. \
It is used for scaffolding, furniture, flutes, paper and food: young shoots are cooked as vegetables. \
Giant pandas eat almost nothing else.""",
     {"thing": "bamboo stem", "made": "hollow woody segments", "use": "building and crafts",
      "meaning": "a loud crackling", "cat": "Grasses"}),
    ("Saffron", """'''Saffron''' is a spice made from the red threads of the saffron crocus flower. \
Each flower has only three threads, which are picked by hand. \
About 150,000 flowers are needed for a single kilogram, which makes it the costliest spice by weight. \
It gives paella, risotto and many Persian dishes their golden colour.""",
     {"thing": "crocus field", "made": "flower threads", "use": "colouring and flavouring food",
      "meaning": "yellow", "cat": "Spices"}),
    ("Aqueduct", """An '''aqueduct''' is a channel that carries water across long distances, often on arches over valleys. \
Roman aqueducts ran mostly underground, sloping gently so that gravity moved the water. \
The city of Rome was fed by eleven of them. \
The Pont du Gard in France is one of the best-preserved sections.""",
     {"thing": "aqueduct", "made": "stone arches and mortar", "use": "supplying towns with water",
      "meaning": "to lead water", "cat": "Water supply"}),
    ("Semaphore", """'''Semaphore''' is a way of sending messages over a distance with the positions of arms or flags. \
In the 1790s Claude Chappe built a chain of towers across France with movable wooden arms. \
A message could cross the country in a few hours, far faster than a horse. \
Sailors still learn to signal with two hand-held flags.""",
     {"thing": "signal tower", "made": "wooden arms on a mast", "use": "sending messages",
      "meaning": "a bearer of signs", "cat": "Telecommunications"}),
    ("Salt", """'''Salt''', mostly sodium chloride, is a mineral that people and animals need to live. \
It is mined from old sea beds or made by letting sea water evaporate in shallow pans. \
Before refrigeration, salt was the main way to preserve meat and fish. \
Roman soldiers were said to be paid partly in salt, the origin of the word ''salary''.""",
     {"thing": "salt pan", "made": "evaporated sea water", "use": "preserving food",
      "meaning": "the sea", "cat": "Minerals"}),
    ("Orchard", """An '''orchard''' is a planting of fruit or nut trees kept for food. \
Apples, pears, cherries, citrus and almonds are among the most common orchard crops. \
Growers prune the trees in winter and thin the young fruit in spring. \
Old orchards are rich habitats for birds, bats and insects.""",
     {"thing": "orchard", "made": "rows of grafted trees", "use": "growing fruit",
      "meaning": "a garden of plants", "cat": "Agriculture"}),
    ("Stained glass", """'''Stained glass''' is coloured glass cut into pieces and joined with strips of lead to form pictures. \
Gothic cathedrals filled their tall windows with it, telling stories to people who could not read. \
Colours come from metal oxides mixed into the molten glass: cobalt for blue, copper for green. \
Light through the windows moves across the floor as the day goes on.""",
     {"thing": "window", "made": "coloured glass and lead", "use": "telling stories in light",
      "meaning": "coloured glass", "cat": "Glass art"}),
    ("Abacus", """An '''abacus''' is a counting frame with beads that slide on rods. \
Each rod stands for a place value, such as ones, tens or hundreds. \
Skilled users can add and multiply faster than many people with a calculator. \
The Chinese ''suanpan'' (算盘) and the Japanese ''soroban'' (算盤) are still taught in schools.""",
     {"thing": "abacus", "made": "wooden beads on rods", "use": "doing arithmetic",
      "meaning": "a board covered with sand", "cat": "Mathematical tools"}),
    ("Fjord", """A '''fjord''' is a long, narrow and deep inlet of the sea between steep cliffs, carved by a glacier. \
Norway's coast is cut by more than a thousand of them. \
The water can be deeper than the open sea outside, because a ridge of rock lies at the mouth. \
Villages sit on small shelves of flat land where rivers enter the fjord.""",
     {"thing": "fjord", "made": "rock carved by ice", "use": "sheltering boats",
      "meaning": "a place to cross", "cat": "Landforms"}),
    ("Puppetry", """'''Puppetry''' is theatre performed with figures moved by people. \
Hand puppets, string marionettes, rod puppets and shadow puppets each need different skills. \
In Indonesia, ''wayang kulit'' shadow plays can last a whole night. \
Television puppets made of foam and felt became famous in the 20th century.""",
     {"thing": "puppet", "made": "wood, cloth and string", "use": "telling stories on stage",
      "meaning": "a little doll", "cat": "Theatre"}),
    ("Cartography", """'''Cartography''' is the study and practice of making maps. \
Mapmakers must choose a projection, because a round Earth cannot be drawn flat without distortion. \
Ptolemy listed the coordinates of some eight thousand places in the 2nd century. \
Satellites and GPS have made maps far more accurate, but choosing what to show is still an art.""",
     {"thing": "map", "made": "surveys and ink", "use": "finding the way",
      "meaning": "the writing of charts", "cat": "Maps"}),
    ("Morse code", """'''Morse code''' writes letters as short and long signals, called dots and dashes. \
It was designed in the 1830s and 1840s for the electric telegraph. \
The best-known signal is SOS: three dots, three dashes, three dots (··· ––– ···). \
Radio amateurs still use it, because a weak signal in Morse gets through where speech does not.""",
     {"thing": "telegraph key", "made": "a brass lever and a spring", "use": "sending messages",
      "meaning": "the code of Morse", "cat": "Telecommunications"}),
    ("Greek alphabet", """The '''Greek alphabet''' has twenty-four letters and has been used to write Greek since about 800 BC. \
The small letter sigma has two forms: σ inside a word and ς at its end, as in λόγος and Σωκράτης. \
Scientists use its letters as symbols, such as π for the ratio of a circle's circumference to its diameter. \
Capital letters are written ΑΒΓΔ, and lower case αβγδ.""",
     {"thing": "alphabet", "made": "twenty-four letters", "use": "writing Greek",
      "meaning": "alpha and beta", "cat": "Writing systems"}),
    ("Arabic calligraphy", """'''Arabic calligraphy''' is the art of beautiful writing in the Arabic script (الخط العربي). \
Arabic is written from right to left, and letters join one another within a word. \
Calligraphers use a reed pen, the ''qalam'', cut at an angle. \
Styles such as Kufic and Naskh decorate books, coins, tiles and mosques; Hebrew (עברית) scribes have a similar tradition.""",
     {"thing": "reed pen", "made": "a cut reed and ink", "use": "writing beautifully",
      "meaning": "the line", "cat": "Calligraphy"}),
    ("Tokyo Station", """'''Tokyo Station''' (東京駅, ''Tōkyō-eki'') is a railway station in the Marunouchi district of Tokyo, Japan. \
Its red-brick building opened in 1914 and was restored to its original form in 2012. \
High-speed Shinkansen trains leave from here for Osaka, Sendai and beyond. \
More than three thousand trains stop at the station every day.""",
     {"thing": "station", "made": "red brick and steel", "use": "serving trains",
      "meaning": "the eastern capital", "cat": "Railway stations"}),
    ("Emoji", """An '''emoji''' is a small picture used in text, such as 😀, 🎉 or 🍞. \
The first set was made for Japanese mobile phones in 1999; the word comes from 絵 (picture) and 文字 (character). \
Some emoji combine several code points, such as a family 👨‍👩‍👧 joined with invisible joiners, or a flag 🇯🇵. \
Skin tones are added with modifiers, as in 👍🏽.""",
     {"thing": "emoji", "made": "Unicode code points", "use": "adding tone to messages",
      "meaning": "picture character", "cat": "Unicode"}),
    ("Diacritic", """A '''diacritic''' is a mark added to a letter to change its sound, such as the accents in café, naïve and Ångström. \
In Unicode a letter like é can be one code point or two: e followed by a combining acute accent (e\u0301). \
Vietnamese stacks two marks on some vowels, as in ''Việt'' and ''ở''. \
Polish uses ą, ę, ł and ż; Czech has the háček in č, ř and ž.""",
     {"thing": "accent mark", "made": "dots, strokes and hooks", "use": "showing pronunciation",
      "meaning": "distinguishing", "cat": "Writing systems"}),
]
